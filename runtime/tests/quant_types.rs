//! Types lode knows by name but cannot compute with, and the CPU-only weight types: a
//! model is refused with an error naming the tensor, its type and the supported types;
//! a model whose matrices are a CPU-only type runs on the CPU backend.

use std::sync::Arc;

use lode_runtime::gguf::GgufFile;
use lode_runtime::model::{Model, ModelError};
use lode_runtime::quant::GgmlType;

mod weights_common;
use weights_common::model_bytes_with;

#[test]
fn a_model_with_a_type_lode_cannot_compute_is_refused_by_name() {
    for ty in [GgmlType::IQ2_XXS, GgmlType::IQ1_M, GgmlType::TQ2_0, GgmlType::I8] {
        let bytes = model_bytes_with(&|name| if name == "blk.1.ffn_up.weight" { ty } else { GgmlType::Q8_0 });
        // The file itself is valid: it opens.
        let f = Arc::new(GgufFile::from_bytes(bytes).unwrap());
        assert_eq!(f.tensor("blk.1.ffn_up.weight").unwrap().info.ty, ty);
        let e = Model::load(f).err().expect("refused");
        assert!(matches!(&e, ModelError::UnsupportedType { name, ty: t, .. } if name == "blk.1.ffn_up.weight" && *t == ty), "{e}");
        let msg = e.to_string();
        for part in ["blk.1.ffn_up.weight", ty.name(), "Q4_K", "Q6_K", "Q8_0"] {
            assert!(msg.contains(part), "{msg}");
        }
    }
}
