//! Parsing the header, metadata and tensor-info records. Every read is bounds-checked
//! against the bytes that remain, and every count is checked against the file size
//! before anything is allocated for it, so no input can panic or exhaust memory by lying
//! about a length.

use std::collections::HashMap;

use super::validate;
use super::{GgufError, MetaValue, TensorInfo, ValueType};

/// Alignment when `general.alignment` is absent (ggml's `GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml refuses arrays with more elements than this; so do we.
const MAX_ARRAY_LEN: u64 = 1 << 30;
/// ggml refuses strings longer than this; so do we.
const MAX_STRING_LEN: u64 = 1 << 30;
/// Arrays of arrays deeper than this are refused (bounds recursion on hostile input).
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Smallest possible tensor-info record: name length, n_dims, type, offset.
const MIN_TENSOR_INFO: u64 = 8 + 4 + 4 + 8;
/// Smallest possible key/value record: key length, value type, one byte of value.
const MIN_KV: u64 = 8 + 4 + 1;

/// Everything the header region says, validated.
pub(crate) struct Parsed {
    pub version: u32,
    pub alignment: u64,
    pub data_offset: u64,
    pub tensor_info_offset: u64,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorInfo>,
}

/// A bounds-checked little-endian reader over the file's bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.offset(),
                need: n,
                have: self.remaining(),
            });
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A count that promises at least `min_each` bytes per item: refuse it if the rest of
    /// the file cannot hold that many.
    fn count(&mut self, min_each: u64, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        let at = self.offset();
        let n = self.u64(what)?;
        let fits = n.checked_mul(min_each).is_some_and(|b| b <= self.remaining());
        if !fits {
            return Err(GgufError::LengthTooLarge {
                what: what(),
                offset: at,
                len: n,
                remaining: self.remaining(),
            });
        }
        Ok(n)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len_what = || format!("length of {}", what());
        let len = self.count(1, &len_what)?;
        if len > MAX_STRING_LEN {
            return Err(GgufError::LengthTooLarge {
                what: len_what(),
                offset: self.offset() - 8,
                len,
                remaining: self.remaining(),
            });
        }
        let at = self.offset();
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => Err(GgufError::InvalidUtf8 { what: what(), offset: at }),
        }
    }
}

/// Parse and validate everything but the tensor data itself (which is bounds- and
/// overlap-checked against `bytes.len()`).
pub(crate) fn parse(bytes: &[u8]) -> Result<Parsed, GgufError> {
    let mut c = Cursor { buf: bytes, pos: 0 };
    let magic = c.take(4, &|| "magic".into()).map_err(|_| GgufError::BadMagic {
        found: bytes[..bytes.len().min(4)].to_vec(),
    })?;
    if magic != b"GGUF" {
        return Err(GgufError::BadMagic { found: magic.to_vec() });
    }
    let version = c.u32(&|| "version".into())?;
    if version != 2 && version != 3 {
        let hint = if version != 0 && version & 0xffff == 0 {
            " (the file may be big-endian; lode reads little-endian files only)"
        } else {
            ""
        };
        return Err(GgufError::UnsupportedVersion { version, hint });
    }
    let n_tensors = c.count(MIN_TENSOR_INFO, &|| "tensor count".into())?;
    let n_kv = c.count(MIN_KV, &|| "metadata key/value count".into())?;

    let metadata = read_metadata(&mut c, n_kv)?;
    let alignment = alignment_of(&metadata)?;
    let tensor_info_offset = c.offset();
    let tensors = read_tensor_infos(&mut c, n_tensors)?;

    let data_offset = validate::align_up(c.offset(), alignment).ok_or_else(|| {
        GgufError::Invalid(format!("data offset overflows after byte {}", c.offset()))
    })?;
    validate::tensor_data(&tensors, data_offset, alignment, bytes.len() as u64)?;
    Ok(Parsed { version, alignment, data_offset, tensor_info_offset, metadata, tensors })
}

fn read_metadata(c: &mut Cursor, n_kv: u64) -> Result<Vec<(String, MetaValue)>, GgufError> {
    let mut metadata = Vec::with_capacity(n_kv as usize);
    let mut seen: HashMap<String, ()> = HashMap::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key_at = c.offset();
        let key = c.string(&|| format!("key of metadata record #{i}"))?;
        if key.is_empty() {
            return Err(GgufError::EmptyKey { offset: key_at });
        }
        if seen.insert(key.clone(), ()).is_some() {
            return Err(GgufError::DuplicateKey { key, offset: key_at });
        }
        let what = || format!("value type of key '{key}'");
        let ty_at = c.offset();
        let ty_id = c.u32(&what)?;
        let ty = ValueType::from_id(ty_id).ok_or_else(|| GgufError::UnknownValueType {
            id: ty_id,
            what: format!("key '{key}'"),
            offset: ty_at,
        })?;
        let value = read_value(c, ty, &key, 0)?;
        metadata.push((key, value));
    }
    Ok(metadata)
}

fn read_value(c: &mut Cursor, ty: ValueType, key: &str, depth: usize) -> Result<MetaValue, GgufError> {
    let what = || format!("value of key '{key}'");
    Ok(match ty {
        ValueType::U8 => MetaValue::U8(u8::from_le_bytes(c.array(&what)?)),
        ValueType::I8 => MetaValue::I8(i8::from_le_bytes(c.array(&what)?)),
        ValueType::U16 => MetaValue::U16(u16::from_le_bytes(c.array(&what)?)),
        ValueType::I16 => MetaValue::I16(i16::from_le_bytes(c.array(&what)?)),
        ValueType::U32 => MetaValue::U32(u32::from_le_bytes(c.array(&what)?)),
        ValueType::I32 => MetaValue::I32(i32::from_le_bytes(c.array(&what)?)),
        ValueType::F32 => MetaValue::F32(f32::from_le_bytes(c.array(&what)?)),
        ValueType::U64 => MetaValue::U64(u64::from_le_bytes(c.array(&what)?)),
        ValueType::I64 => MetaValue::I64(i64::from_le_bytes(c.array(&what)?)),
        ValueType::F64 => MetaValue::F64(f64::from_le_bytes(c.array(&what)?)),
        ValueType::Bool => {
            let at = c.offset();
            match c.array::<1>(&what)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                value => return Err(GgufError::BadBool { what: what(), offset: at, value }),
            }
        }
        ValueType::String => MetaValue::String(c.string(&what)?),
        ValueType::Array => read_array(c, key, depth)?,
    })
}

fn read_array(c: &mut Cursor, key: &str, depth: usize) -> Result<MetaValue, GgufError> {
    let at = c.offset();
    if depth >= MAX_ARRAY_DEPTH {
        return Err(GgufError::ArrayTooDeep { key: key.to_string(), offset: at, max: MAX_ARRAY_DEPTH });
    }
    let elem_id = c.u32(&|| format!("array element type of key '{key}'"))?;
    let elem = ValueType::from_id(elem_id).ok_or_else(|| GgufError::UnknownValueType {
        id: elem_id,
        what: format!("array elements of key '{key}'"),
        offset: at,
    })?;
    let count_what = || format!("element count of array '{key}'");
    let n = c.count(elem.min_encoded_size(), &count_what)?;
    if n > MAX_ARRAY_LEN {
        return Err(GgufError::LengthTooLarge {
            what: count_what(),
            offset: at + 4,
            len: n,
            remaining: c.remaining(),
        });
    }
    let mut items = Vec::with_capacity(n as usize);
    for _ in 0..n {
        items.push(read_value(c, elem, key, depth + 1)?);
    }
    Ok(MetaValue::Array(elem, items))
}

/// `general.alignment`: absent → 32; otherwise a u32 power of two.
fn alignment_of(metadata: &[(String, MetaValue)]) -> Result<u64, GgufError> {
    let Some((_, v)) = metadata.iter().find(|(k, _)| k == "general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match v {
        MetaValue::U32(a) if a.is_power_of_two() => Ok(u64::from(*a)),
        MetaValue::U32(a) => Err(GgufError::BadAlignment {
            reason: format!("{a} is not a non-zero power of two"),
        }),
        other => Err(GgufError::BadAlignment {
            reason: format!("must be u32, found {}", other.type_name()),
        }),
    }
}

fn read_tensor_infos(c: &mut Cursor, n: u64) -> Result<Vec<TensorInfo>, GgufError> {
    let mut tensors = Vec::with_capacity(n as usize);
    let mut seen: HashMap<String, ()> = HashMap::with_capacity(n as usize);
    for i in 0..n {
        let at = c.offset();
        let name = c.string(&|| format!("name of tensor #{i}"))?;
        if seen.insert(name.clone(), ()).is_some() {
            return Err(GgufError::DuplicateTensor { name, offset: at });
        }
        let what = || format!("info of tensor '{name}'");
        let n_dims = c.u32(&what)?;
        if !(1..=4).contains(&n_dims) {
            return Err(GgufError::BadDimCount { tensor: name, offset: at, n_dims });
        }
        let mut ne = [0i64; 4];
        for d in ne.iter_mut().take(n_dims as usize) {
            *d = i64::from_le_bytes(c.array(&what)?);
        }
        let ty_id = c.u32(&what)?;
        let offset = c.u64(&what)?;
        let info = validate::tensor_info(name, &ne[..n_dims as usize], ty_id, offset, at)?;
        tensors.push(info);
    }
    Ok(tensors)
}
