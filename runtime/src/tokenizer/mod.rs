//! tokenizer (to be built).
