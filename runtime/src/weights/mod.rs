//! weights (to be built).
