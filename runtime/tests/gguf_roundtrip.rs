//! Property: whatever the writer writes, the reader reads back unchanged — random
//! metadata of every value type (nested arrays included), random tensors of every type
//! and shape, both versions, several alignments.

use lode_runtime::gguf::{GgufFile, GgufWriter, MetaValue, ValueType};
use lode_runtime::quant::GgmlType;
use proptest::prelude::*;

fn float32() -> impl Strategy<Value = f32> {
    any::<f32>().prop_filter("NaN never compares equal", |x| !x.is_nan())
}

fn float64() -> impl Strategy<Value = f64> {
    any::<f64>().prop_filter("NaN never compares equal", |x| !x.is_nan())
}

fn value_of(t: ValueType, depth: u32) -> BoxedStrategy<MetaValue> {
    match t {
        ValueType::U8 => any::<u8>().prop_map(MetaValue::U8).boxed(),
        ValueType::I8 => any::<i8>().prop_map(MetaValue::I8).boxed(),
        ValueType::U16 => any::<u16>().prop_map(MetaValue::U16).boxed(),
        ValueType::I16 => any::<i16>().prop_map(MetaValue::I16).boxed(),
        ValueType::U32 => any::<u32>().prop_map(MetaValue::U32).boxed(),
        ValueType::I32 => any::<i32>().prop_map(MetaValue::I32).boxed(),
        ValueType::U64 => any::<u64>().prop_map(MetaValue::U64).boxed(),
        ValueType::I64 => any::<i64>().prop_map(MetaValue::I64).boxed(),
        ValueType::F32 => float32().prop_map(MetaValue::F32).boxed(),
        ValueType::F64 => float64().prop_map(MetaValue::F64).boxed(),
        ValueType::Bool => any::<bool>().prop_map(MetaValue::Bool).boxed(),
        ValueType::String => ".{0,12}".prop_map(MetaValue::String).boxed(),
        ValueType::Array => {
            let elem = if depth >= 2 {
                prop::sample::select(&ValueType::ALL[..9]).prop_filter("no deeper arrays", |t| *t != ValueType::Array).boxed()
            } else {
                prop::sample::select(&ValueType::ALL[..]).boxed()
            };
            elem.prop_flat_map(move |e| {
                prop::collection::vec(value_of(e, depth + 1), 0..6).prop_map(move |items| MetaValue::Array(e, items))
            })
            .boxed()
        }
    }
}

fn any_value() -> impl Strategy<Value = MetaValue> {
    prop::sample::select(&ValueType::ALL[..]).prop_flat_map(|t| value_of(t, 0))
}

/// (type, dims, data) with a whole number of blocks per row.
fn any_tensor() -> impl Strategy<Value = (GgmlType, Vec<u64>, Vec<u8>)> {
    (prop::sample::select(&GgmlType::ALL[..]), 1u64..4, prop::collection::vec(1u64..4, 0..4)).prop_flat_map(
        |(ty, blocks, rest)| {
            let mut dims = vec![blocks * ty.block_elems() as u64];
            dims.extend(rest);
            let n: u64 = dims.iter().product();
            let bytes = ty.bytes_for(n).unwrap() as usize;
            prop::collection::vec(any::<u8>(), bytes).prop_map(move |data| (ty, dims.clone(), data))
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn write_then_read_round_trips(
        values in prop::collection::vec(any_value(), 0..12),
        tensors in prop::collection::vec(any_tensor(), 0..6),
        version in 2u32..4,
        alignment in prop::sample::select(vec![None, Some(1u32), Some(8), Some(32), Some(64), Some(256)]),
    ) {
        let mut w = GgufWriter::new();
        w.set_version(version);
        if let Some(a) = alignment {
            w.add_kv("general.alignment", MetaValue::U32(a));
        }
        for (i, v) in values.iter().enumerate() {
            w.add_kv(format!("test.key_{i}"), v.clone());
        }
        for (i, (ty, dims, data)) in tensors.iter().enumerate() {
            w.add_tensor(format!("blk.{i}.weight"), *ty, dims, data.clone());
        }
        let bytes = w.to_bytes().unwrap();
        let f = GgufFile::from_bytes(bytes).unwrap();

        prop_assert_eq!(f.version(), version);
        prop_assert_eq!(f.alignment(), u64::from(alignment.unwrap_or(32)));
        prop_assert_eq!(f.metadata(), w.metadata());
        prop_assert_eq!(f.tensors().len(), tensors.len());
        for (i, (ty, dims, data)) in tensors.iter().enumerate() {
            let v = f.tensor(&format!("blk.{i}.weight")).unwrap();
            prop_assert_eq!(v.info.ty, *ty);
            prop_assert_eq!(&v.info.dims, dims);
            prop_assert_eq!(v.data, &data[..]);
            prop_assert_eq!(v.file_offset % f.alignment(), 0);
        }
    }
}
