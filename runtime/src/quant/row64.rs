//! The row64 layouts for Q4_K and Q6_K (reference §4.3).
