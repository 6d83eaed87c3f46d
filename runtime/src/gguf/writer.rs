//! Writing GGUF files the way llama.cpp's writers lay them out: header, metadata,
//! tensor infos, zero padding to the alignment, then each tensor's bytes padded to the
//! alignment. Tensors can carry their bytes, or be declared with
//! [`GgufWriter::add_tensor_info`] and streamed at write time (`lode synth` writes
//! multi-GB files this way without holding them in memory).

use std::io::Write;
use std::path::Path;

use super::reader::DEFAULT_ALIGNMENT;
use super::validate::{align_up, shape_bytes};
use super::{GgufError, MetaValue, TensorInfo, ValueType};
use crate::quant::GgmlType;

/// Builds a GGUF file and writes it out as llama.cpp would.
pub struct GgufWriter {
    version: u32,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<Pending>,
}

struct Pending {
    name: String,
    ty: GgmlType,
    dims: Vec<u64>,
    /// `None`: streamed by the caller's fill function at write time.
    data: Option<Vec<u8>>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter { version: 3, metadata: Vec::new(), tensors: Vec::new() }
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Write this header version (2 or 3; the layouts are identical for little-endian
    /// files). Default 3.
    pub fn set_version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    /// Version 3, alignment 32 unless `general.alignment` is set. Setting a key twice
    /// replaces the first value (a file with duplicate keys would not load).
    pub fn add_kv(&mut self, key: impl Into<String>, value: MetaValue) -> &mut Self {
        let key = key.into();
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    /// `data` must be exactly `ty.bytes_for(product(dims))` bytes (checked when written).
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        dims: &[u64],
        data: Vec<u8>,
    ) -> &mut Self {
        self.tensors.push(Pending { name: name.into(), ty, dims: dims.to_vec(), data: Some(data) });
        self
    }

    /// Declare a tensor whose bytes the `fill` function of [`GgufWriter::write_stream`]
    /// produces at write time.
    pub fn add_tensor_info(&mut self, name: impl Into<String>, ty: GgmlType, dims: &[u64]) -> &mut Self {
        self.tensors.push(Pending { name: name.into(), ty, dims: dims.to_vec(), data: None });
        self
    }

    /// The metadata as it will be written, in order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// The alignment the file will use.
    pub fn alignment(&self) -> Result<u64, GgufError> {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some((_, MetaValue::U32(a))) if a.is_power_of_two() => Ok(u64::from(*a)),
            Some((_, v)) => Err(GgufError::BadAlignment {
                reason: format!("must be a u32 power of two, got {} {v}", v.type_name()),
            }),
        }
    }

    /// The tensor records as they will be written (offsets relative to the data
    /// section, each tensor padded to the alignment), after checking every shape, name
    /// and data length.
    pub fn layout(&self) -> Result<Vec<TensorInfo>, GgufError> {
        let align = self.alignment()?;
        let mut names = std::collections::HashSet::new();
        let mut offset = 0u64;
        let mut out = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            if !names.insert(t.name.as_str()) {
                return Err(GgufError::DuplicateTensor { name: t.name.clone(), offset: 0 });
            }
            if t.dims.is_empty() || t.dims.len() > 4 {
                return Err(GgufError::BadDimCount {
                    tensor: t.name.clone(),
                    offset: 0,
                    n_dims: t.dims.len() as u32,
                });
            }
            let n_bytes = shape_bytes(&t.name, t.ty, &t.dims)?;
            if let Some(d) = &t.data {
                if d.len() as u64 != n_bytes {
                    return Err(GgufError::ByteSizeMismatch {
                        tensor: t.name.clone(),
                        expected: n_bytes,
                        got: d.len() as u64,
                    });
                }
            }
            out.push(TensorInfo { name: t.name.clone(), ty: t.ty, dims: t.dims.clone(), offset, n_bytes });
            offset = offset
                .checked_add(n_bytes)
                .and_then(|end| align_up(end, align))
                .ok_or_else(|| GgufError::ShapeOverflow { tensor: t.name.clone(), dims: t.dims.clone() })?;
        }
        Ok(out)
    }

    /// The whole file in memory. Every tensor must carry its bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        let mut out = Vec::new();
        self.write_stream(&mut out, "<memory>", |_, info, _| Err(missing(info)))?;
        Ok(out)
    }

    /// Write the file to `path`. Every tensor must carry its bytes.
    pub fn write_to(&self, path: impl AsRef<Path>) -> Result<(), GgufError> {
        let path = path.as_ref();
        let io_err = |err| GgufError::Io { path: path.display().to_string(), err };
        let file = std::fs::File::create(path).map_err(io_err)?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
        self.write_stream(&mut w, &path.display().to_string(), |_, info, _| Err(missing(info)))?;
        w.flush().map_err(io_err)
    }

    /// Write the file to `w`, calling `fill(index, info, out)` for each tensor declared
    /// with [`GgufWriter::add_tensor_info`]; it must write exactly `info.n_bytes` bytes.
    /// `label` names the destination in errors.
    pub fn write_stream<W, F>(&self, w: &mut W, label: &str, mut fill: F) -> Result<(), GgufError>
    where
        W: Write,
        F: FnMut(usize, &TensorInfo, &mut dyn Write) -> std::io::Result<()>,
    {
        let io_err = |err| GgufError::Io { path: label.to_string(), err };
        let align = self.alignment()?;
        let layout = self.layout()?;
        let header = self.header_bytes(&layout, align)?;
        w.write_all(&header).map_err(io_err)?;
        let zeros = [0u8; 4096];
        for (i, (info, t)) in layout.iter().zip(&self.tensors).enumerate() {
            match &t.data {
                Some(d) => w.write_all(d).map_err(io_err)?,
                None => {
                    let mut counted = Counting { inner: &mut *w, n: 0 };
                    fill(i, info, &mut counted).map_err(io_err)?;
                    if counted.n != info.n_bytes {
                        return Err(GgufError::ByteSizeMismatch {
                            tensor: info.name.clone(),
                            expected: info.n_bytes,
                            got: counted.n,
                        });
                    }
                }
            }
            let mut pad = align_up(info.n_bytes, align).unwrap_or(info.n_bytes) - info.n_bytes;
            while pad > 0 {
                let n = pad.min(zeros.len() as u64);
                w.write_all(&zeros[..n as usize]).map_err(io_err)?;
                pad -= n;
            }
        }
        Ok(())
    }

    /// Magic, version, counts, metadata, tensor infos and the padding before the data.
    fn header_bytes(&self, layout: &[TensorInfo], align: u64) -> Result<Vec<u8>, GgufError> {
        let mut h = Vec::new();
        h.extend_from_slice(b"GGUF");
        h.extend_from_slice(&self.version.to_le_bytes());
        h.extend_from_slice(&(layout.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            if key.is_empty() {
                return Err(GgufError::EmptyKey { offset: h.len() as u64 });
            }
            put_str(&mut h, key);
            h.extend_from_slice(&value.value_type().id().to_le_bytes());
            put_value(&mut h, key, value)?;
        }
        for t in layout {
            put_str(&mut h, &t.name);
            h.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for &d in &t.dims {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&t.ty.id().to_le_bytes());
            h.extend_from_slice(&t.offset.to_le_bytes());
        }
        let padded = align_up(h.len() as u64, align).unwrap_or(h.len() as u64);
        h.resize(padded as usize, 0);
        Ok(h)
    }
}

fn missing(info: &TensorInfo) -> std::io::Error {
    std::io::Error::other(format!("tensor '{}' was declared without data", info.name))
}

fn put_str(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

fn put_value(h: &mut Vec<u8>, key: &str, v: &MetaValue) -> Result<(), GgufError> {
    match v {
        MetaValue::U8(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I8(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => h.push(u8::from(*x)),
        MetaValue::String(s) => put_str(h, s),
        MetaValue::Array(elem, items) => {
            h.extend_from_slice(&elem.id().to_le_bytes());
            h.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                if it.value_type() != *elem {
                    return Err(GgufError::TypeMismatch {
                        key: key.to_string(),
                        expected: array_elem_label(*elem),
                        found: format!("an array holding {}", it.type_name()),
                    });
                }
                put_value(h, key, it)?;
            }
        }
    }
    Ok(())
}

fn array_elem_label(t: ValueType) -> &'static str {
    match t {
        ValueType::U8 => "an array of u8",
        ValueType::I8 => "an array of i8",
        ValueType::U16 => "an array of u16",
        ValueType::I16 => "an array of i16",
        ValueType::U32 => "an array of u32",
        ValueType::I32 => "an array of i32",
        ValueType::F32 => "an array of f32",
        ValueType::Bool => "an array of bool",
        ValueType::String => "an array of string",
        ValueType::Array => "an array of array",
        ValueType::U64 => "an array of u64",
        ValueType::I64 => "an array of i64",
        ValueType::F64 => "an array of f64",
    }
}

/// Counts the bytes a fill function writes, so a short or long tensor is an error.
struct Counting<'w, W: Write> {
    inner: &'w mut W,
    n: u64,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
