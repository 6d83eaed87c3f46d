//! Per-step staging of host inputs (token ids, positions, a batched step's cache table):
//! values are written into slots of one device region whose addresses repeat step after
//! step, so a captured decode graph replays unchanged. A replayable decode step predicts
//! its positions (the previous step's, each one further), stages them and launches its
//! graph at the first op, before the host has verified the rest of the step.

use super::{derr, GpuBackend};
use crate::backend::gpu::device::{DeviceBuffer, GpuDevice};
use crate::backend::gpu::driver::{DevPtr, DriverError};
use crate::backend::gpu::replay::Entry;
use crate::backend::Result;

/// A reusable device scratch region that only grows.
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) buf: Option<DeviceBuffer>,
    /// Times the region was reallocated (its contents lost).
    pub(super) grown: u64,
}
impl Scratch {
    pub(super) fn get(&mut self, dev: &GpuDevice, bytes: usize) -> std::result::Result<DevPtr, DriverError> {
        if self.buf.as_ref().map(|b| b.len() < bytes).unwrap_or(true) {
            self.grown += 1;
            self.buf = None;
            self.buf = Some(dev.alloc(bytes.next_power_of_two().max(4096))?);
        }
        Ok(self.buf.as_ref().map(|b| b.ptr()).unwrap_or(0))
    }
}

impl GpuBackend {
    /// Copy host values into this step's next staging slot; returns its address.
    pub(super) fn stage_bytes(&mut self, bytes: &[u8]) -> Result<DevPtr> {
        let need = self.stage_used + bytes.len().div_ceil(256) * 256;
        if self.stage.buf.as_ref().map(|b| b.len() < need).unwrap_or(true) {
            if let Some(old) = self.stage.buf.take() {
                self.retired.push(old);
            }
            self.stage_used = 0;
            self.stage.get(&self.dev, (need * 2).max(1 << 16)).map_err(derr("staging"))?;
        }
        let p = self.stage.buf.as_ref().map(|b| b.ptr()).unwrap_or(0) + self.stage_used as u64;
        self.stage_used += bytes.len().div_ceil(256) * 256;
        self.dev.write(p, bytes).map_err(derr("staging"))?;
        Ok(p)
    }

    /// Address the next staging slot would get.
    pub(super) fn stage_slot_addr(&self) -> DevPtr {
        self.stage.buf.as_ref().map(|b| b.ptr()).unwrap_or(0) + self.stage_used as u64
    }

    /// At a replayable step's first op: stage the positions the step will most likely
    /// use (the previous step's, each one further) where it staged them, and launch the
    /// graph now so the GPU runs while the host verifies the rest of the step.
    pub(super) fn speculate(&mut self, first: &Entry) -> Result<()> {
        if !self.replay.get_mut().can_speculate() {
            return Ok(());
        }
        let Some((prev, ptr)) = self.prev_pos.clone() else { return Ok(()) };
        // Decode steps only, and only while the predicted position is inside every KV
        // cache: a wrong guess is recomputed, but the speculative run must stay in bounds
        // (regression: repeated 512-token prefills predicted positions past the cache).
        if prev.len() != 1 {
            return Ok(());
        }
        let n = prev.len() as u32;
        let pred: Vec<u32> = prev.iter().map(|p| p + n).collect();
        let cap = self.kvs.values().map(|k| k.spec.n_ctx).min().unwrap_or(0);
        if pred.iter().any(|&p| p as usize >= cap || !self.ring_room(p)) {
            return Ok(());
        }
        let in_stage = self.stage.buf.as_ref().map(|b| ptr >= b.ptr() && ptr + (pred.len() * 4) as u64 <= b.ptr() + b.len() as u64).unwrap_or(false);
        if !in_stage || ptr < self.stage_slot_addr() {
            return Ok(());
        }
        let v: Vec<i32> = pred.iter().map(|&p| p as i32).collect();
        self.dev.write(ptr, bytemuck::cast_slice(&v)).map_err(derr("staging"))?;
        if self.replay.get_mut().speculate(&self.dev, first).map_err(derr("graph replay"))? {
            self.predicted_pos = Some((pred, ptr));
        }
        Ok(())
    }

    /// End of a step: replay or capture, then recycle the staging slots.
    pub(super) fn end_step(&mut self) -> Result<()> {
        self.replay.get_mut().end_step(&self.dev).map_err(derr("graph replay"))?;
        self.stage_used = 0;
        self.prev_pos = self.step_pos.take();
        self.predicted_pos = None;
        Ok(())
    }

    /// Stage positions once per step (as i32) and return their device address.
    pub(super) fn positions(&mut self, pos: &[u32]) -> Result<DevPtr> {
        if let Some((p, ptr)) = &self.step_pos {
            if p.as_slice() == pos {
                return Ok(*ptr);
            }
        }
        if let Some((pred, ptr)) = self.predicted_pos.take() {
            let slot = pos.len().max(1).div_ceil(64) * 256;
            if self.step_pos.is_none() && pred.as_slice() == pos && ptr == self.stage_slot_addr() {
                // Already staged (before the speculative graph launch): take the slot.
                self.stage_used += slot;
                self.step_pos = Some((pred, ptr));
                return Ok(ptr);
            }
            self.replay.get_mut().mispredicted(&self.dev).map_err(derr("graph replay"))?;
        }
        let v: Vec<i32> = pos.iter().map(|&p| p as i32).collect();
        let ptr = self.stage_bytes(bytemuck::cast_slice(&v))?;
        self.step_pos = Some((pos.to_vec(), ptr));
        Ok(ptr)
    }
}
