//! backend (to be built).
