//! What a step *is* versus what it is *bound to*.
//!
//! A step's signature is its work with every buffer address left out: kernel names,
//! grids, blocks, argument kinds and every scalar argument (sizes, strides, counts,
//! flags), and copy sizes. Its bindings are the addresses, in order. Two steps with the
//! same signature differ only in where they read and write, which a graph instance can
//! follow by updating its nodes' parameters (a rebind); a different signature needs a
//! different instance.
//!
//! The signature is hashed with FNV-1a over a fixed byte encoding, so the same work has
//! the same key in every process and every build (no per-process hash seed), and it is
//! computed from the entries' contents, never from where they are stored: a freed and
//! reused record array cannot alias an old key. The hash only speeds up lookups: an
//! instance is reused only after its record compares equal entry by entry.

use super::Entry;
use crate::backend::gpu::driver::{DevPtr, KArg};

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, fed field by field.
#[derive(Clone, Copy, Debug)]
pub struct Fnv(pub u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(FNV_OFFSET)
    }
}

impl Fnv {
    pub fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= x as u64;
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
    }
    pub fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
}

/// Feed one entry's shape (not its addresses) into `h`.
pub fn hash_entry(h: &mut Fnv, e: &Entry) {
    match e {
        Entry::Kernel { name, grid, block, args } => {
            h.bytes(b"K");
            h.bytes(name.as_bytes());
            h.bytes(&[0]);
            for v in grid.iter().chain(block.iter()) {
                h.u64(*v as u64);
            }
            h.u64(args.len() as u64);
            for a in args {
                match a {
                    KArg::Ptr(_) => h.bytes(b"p"),
                    KArg::I32(v) => {
                        h.bytes(b"i");
                        h.u64(*v as u32 as u64)
                    }
                    KArg::U32(v) => {
                        h.bytes(b"u");
                        h.u64(*v as u64)
                    }
                    KArg::F32(v) => {
                        h.bytes(b"f");
                        h.u64(v.to_bits() as u64)
                    }
                    KArg::U64(v) => {
                        h.bytes(b"q");
                        h.u64(*v)
                    }
                }
            }
        }
        Entry::Copy { bytes, .. } => {
            h.bytes(b"C");
            h.u64(*bytes as u64);
        }
    }
}

/// The signature of a whole step.
pub fn signature(step: &[Entry]) -> u64 {
    let mut h = Fnv::default();
    h.u64(step.len() as u64);
    for e in step {
        hash_entry(&mut h, e);
    }
    h.0
}

/// Same work, addresses aside.
pub fn same_shape(a: &Entry, b: &Entry) -> bool {
    match (a, b) {
        (Entry::Kernel { name: n1, grid: g1, block: b1, args: a1 }, Entry::Kernel { name: n2, grid: g2, block: b2, args: a2 }) => {
            n1 == n2
                && g1 == g2
                && b1 == b2
                && a1.len() == a2.len()
                && a1.iter().zip(a2).all(|(x, y)| match (x, y) {
                    (KArg::Ptr(_), KArg::Ptr(_)) => true,
                    // Scalars compare by bits (an f32 NaN equals itself).
                    (KArg::F32(p), KArg::F32(q)) => p.to_bits() == q.to_bits(),
                    (p, q) => p == q,
                })
        }
        (Entry::Copy { bytes: x, .. }, Entry::Copy { bytes: y, .. }) => x == y,
        _ => false,
    }
}

/// Same shape and the same addresses: the recorded instance runs this entry as is.
pub fn same_binding(a: &Entry, b: &Entry) -> bool {
    same_shape(a, b) && bindings_of(a).eq(bindings_of(b))
}

/// The addresses an entry is bound to, in argument order.
pub fn bindings_of(e: &Entry) -> impl Iterator<Item = DevPtr> + '_ {
    let (args, copy): (&[KArg], Option<[DevPtr; 2]>) = match e {
        Entry::Kernel { args, .. } => (args, None),
        Entry::Copy { dst, src, .. } => (&[], Some([*dst, *src])),
    };
    args.iter().filter_map(|a| if let KArg::Ptr(p) = a { Some(*p) } else { None }).chain(copy.into_iter().flatten())
}

/// Whole-step shape equality.
pub fn same_shape_steps(a: &[Entry], b: &[Entry]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_shape(x, y))
}
