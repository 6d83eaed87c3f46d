//! backend (to be built).

pub mod gpu;
