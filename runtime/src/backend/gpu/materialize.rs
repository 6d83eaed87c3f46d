//! The weight cache's view of a GPU: [`GpuMaterializer`] (allocate, upload, free through
//! [`GpuDevice`]) and [`MappedFile`] (the model file registered with the device for
//! `mapped` residency: read-only, one registration for the whole mapping).

use std::sync::Arc;

use super::device::{DeviceBuffer, GpuDevice};
use super::driver::{DevPtr, DriverError};
use crate::gguf::GgufFile;
use crate::weights::{DeviceFault, DeviceMemory, Materializer, WeightError};

/// CUDA_ERROR_OUT_OF_MEMORY and hipErrorOutOfMemory are both 2.
const OUT_OF_MEMORY: i32 = 2;

fn fault(e: DriverError) -> DeviceFault {
    let out_of_memory = matches!(e, DriverError::Call { code: OUT_OF_MEMORY, .. });
    DeviceFault { out_of_memory, msg: e.to_string() }
}

pub struct GpuMaterializer {
    pub dev: GpuDevice,
}

impl Materializer for GpuMaterializer {
    type Buffer = DeviceBuffer;
    fn alloc(&mut self, bytes: usize) -> Result<DeviceBuffer, DeviceFault> {
        self.dev.alloc(bytes).map_err(fault)
    }
    fn upload(&mut self, buf: &mut DeviceBuffer, data: &[u8]) -> Result<(), DeviceFault> {
        self.dev.write(buf.ptr(), data).map_err(fault)?;
        // `data` may be a packed copy the cache drops on return: wait for the copy (and
        // surface an asynchronous failure here, where the weight is known).
        self.dev.sync().map_err(fault)
    }
    fn free(&mut self, buf: DeviceBuffer) {
        drop(buf);
    }
    fn addr(&self, buf: &DeviceBuffer) -> u64 {
        buf.ptr()
    }
    fn memory(&self) -> Option<DeviceMemory> {
        let drv = self.dev.mem_info().ok();
        Some(DeviceMemory {
            allocated_bytes: self.dev.allocated_bytes(),
            peak_allocated_bytes: self.dev.peak_allocated_bytes(),
            driver_used_bytes: drv.map(|(free, total)| total.saturating_sub(free)),
            driver_peak_used_bytes: None,
            driver_total_bytes: drv.map(|(_, total)| total),
        })
    }
}

/// The model file's mapping, registered with the device for reads in place. Holds the
/// file, so the mapping outlives the registration; unregisters on drop.
pub struct MappedFile {
    dev: GpuDevice,
    file: Arc<GgufFile>,
    pub device_ptr: DevPtr,
}

impl MappedFile {
    pub fn register(dev: &GpuDevice, file: &Arc<GgufFile>) -> Result<MappedFile, WeightError> {
        let bytes = file.bytes();
        let device_ptr = dev.driver().host_register(bytes).map_err(|e| WeightError::Mapping { bytes: bytes.len() as u64, msg: e.to_string() })?;
        Ok(MappedFile { dev: dev.clone(), file: file.clone(), device_ptr })
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // Kernels reading the mapping must be done before its pages are released.
        let _ = self.dev.sync();
        let _ = self.dev.driver().host_unregister(self.file.bytes());
    }
}
