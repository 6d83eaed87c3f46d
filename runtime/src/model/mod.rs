//! model (to be built).
