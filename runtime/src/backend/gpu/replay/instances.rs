//! A bounded cache of graph instances, keyed by step signature.
//!
//! Each instance remembers the record it was built (or last rebound) from, so a hit can
//! be validated entry by entry before anything is launched. When the cache is full the
//! least recently used instance is destroyed to make room.

use super::signature::{bindings_of, same_shape, same_shape_steps, signature};
use super::{Entry, Executor};
use crate::backend::gpu::driver::RawHandle;

/// One instantiated graph.
pub struct Instance {
    pub sig: u64,
    /// The entries the instance's nodes are bound to now.
    pub record: Vec<Entry>,
    pub exec: RawHandle,
    /// The physical buffers of `record`'s bindings (see [`identities`]).
    pub ids: Vec<(u64, u64)>,
    last_used: u64,
}

/// Each binding's physical buffer: (allocation id, 0), or (0, address) where the
/// executor knows no allocation for the address.
pub fn identities<X: Executor>(x: &X, step: &[Entry]) -> Vec<(u64, u64)> {
    step.iter().flat_map(bindings_of).map(|p| x.allocation(p).map(|id| (id, 0)).unwrap_or((0, p))).collect()
}

pub struct Instances {
    items: Vec<Instance>,
    cap: usize,
    clock: u64,
}

impl Instances {
    /// `cap` instances at most (at least one).
    pub fn new(cap: usize) -> Instances {
        Instances { items: Vec::new(), cap: cap.max(1), clock: 0 }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
    pub fn capacity(&self) -> usize {
        self.cap
    }

    pub fn get(&self, i: usize) -> &Instance {
        &self.items[i]
    }
    pub fn get_mut(&mut self, i: usize) -> &mut Instance {
        &mut self.items[i]
    }

    /// Mark `i` used now.
    pub fn touch(&mut self, i: usize) {
        self.clock += 1;
        self.items[i].last_used = self.clock;
    }

    /// The most recently used instance.
    pub fn latest(&self) -> Option<usize> {
        (0..self.items.len()).max_by_key(|&i| self.items[i].last_used)
    }

    /// An instance for exactly this step's signature.
    pub fn find(&self, step: &[Entry]) -> Option<usize> {
        let sig = signature(step);
        self.items.iter().position(|x| x.sig == sig && same_shape_steps(&x.record, step))
    }

    /// Every instance with `c`'s signature (`c` included).
    pub fn same_signature(&self, c: usize) -> Vec<usize> {
        let r = &self.items[c];
        (0..self.items.len()).filter(|&i| i == c || (self.items[i].sig == r.sig && same_shape_steps(&self.items[i].record, &r.record))).collect()
    }

    /// An instance (other than `skip`) whose record starts with the shape of
    /// `prefix` followed by `next`: the step may still turn out to be that instance's.
    pub fn find_prefix(&self, prefix: &[Entry], next: &Entry, skip: Option<usize>) -> Option<usize> {
        let n = prefix.len();
        self.items.iter().enumerate().filter(|(i, _)| Some(*i) != skip).map(|(i, _)| i).find(|&i| {
            let r = &self.items[i].record;
            r.len() > n && same_shape(&r[n], next) && prefix.iter().zip(r).all(|(a, b)| same_shape(a, b))
        })
    }

    /// Add an instance; when full, the least recently used one is returned for the
    /// caller to destroy. Returns the new instance's index.
    pub fn insert(&mut self, record: Vec<Entry>, exec: RawHandle, ids: Vec<(u64, u64)>) -> (usize, Option<Instance>) {
        let mut evicted = None;
        if self.items.len() >= self.cap {
            let lru = (0..self.items.len()).min_by_key(|&i| self.items[i].last_used).unwrap_or(0);
            evicted = Some(self.items.swap_remove(lru));
        }
        self.clock += 1;
        self.items.push(Instance { sig: signature(&record), record, exec, ids, last_used: self.clock });
        (self.items.len() - 1, evicted)
    }

    /// Remove instance `i` (the caller destroys it).
    pub fn remove(&mut self, i: usize) -> Instance {
        self.items.swap_remove(i)
    }

    /// Every instance, for destruction.
    pub fn drain(&mut self) -> Vec<Instance> {
        std::mem::take(&mut self.items)
    }
}
