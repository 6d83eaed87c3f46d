//! The one interface between a typed launcher and whatever runs its kernel: [`Launch`]
//! (the device's stream, the step recorder of graph replay, a capture of one launch), the
//! typed kernel handles the launchers use ([`Kernel`], whose argument struct is declared
//! with [`kernel_args!`](crate::kernel_args) in the C signature's order), and the
//! activation forms the launchers name ([`ActFmt`]). Every kernel family's launchers take a
//! `&dyn Launch`; nothing else of the device is theirs to see.

use super::driver::{DevPtr, DriverError, KArg};
use super::GpuError;
use std::marker::PhantomData;

/// Where launches go: straight to the device, or through a recorder (the backend's
/// graph capture records every launch of a step).
pub trait Launch {
    fn launch(&self, name: &'static str, grid: [u32; 3], block: [u32; 3], args: &[KArg]) -> Result<(), DriverError>;
}

/// How a kernel parameter is passed, as its C declaration says: a pointer (any `T*`), an
/// `int`, an `unsigned` or a `float`. `tests/kernel_signatures.rs` compares each kernel's
/// list with the preprocessed `.hip` source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgKind {
    Ptr,
    I32,
    U32,
    F32,
}

/// A Rust value that is one kernel parameter.
pub trait KernelArg: Copy {
    const KIND: ArgKind;
    /// The value as passed; Err(v) for a size that does not fit the C type.
    fn karg(self) -> Result<KArg, usize>;
}

/// A device address (`DevPtr`).
impl KernelArg for u64 {
    const KIND: ArgKind = ArgKind::Ptr;
    fn karg(self) -> Result<KArg, usize> {
        Ok(KArg::Ptr(self))
    }
}
/// An optional input: the kernel reads a null pointer as "absent".
impl KernelArg for Option<DevPtr> {
    const KIND: ArgKind = ArgKind::Ptr;
    fn karg(self) -> Result<KArg, usize> {
        Ok(KArg::Ptr(self.unwrap_or(0)))
    }
}
impl KernelArg for i32 {
    const KIND: ArgKind = ArgKind::I32;
    fn karg(self) -> Result<KArg, usize> {
        Ok(KArg::I32(self))
    }
}
impl KernelArg for u32 {
    const KIND: ArgKind = ArgKind::U32;
    fn karg(self) -> Result<KArg, usize> {
        Ok(KArg::U32(self))
    }
}
impl KernelArg for f32 {
    const KIND: ArgKind = ArgKind::F32;
    fn karg(self) -> Result<KArg, usize> {
        Ok(KArg::F32(self))
    }
}
/// A C `int` size or index: one that does not fit is an error, never a wrapped value.
impl KernelArg for usize {
    const KIND: ArgKind = ArgKind::I32;
    fn karg(self) -> Result<KArg, usize> {
        i32::try_from(self).map(KArg::I32).map_err(|_| self)
    }
}
/// A C `int` flag.
impl KernelArg for bool {
    const KIND: ArgKind = ArgKind::I32;
    fn karg(self) -> Result<KArg, usize> {
        Ok(KArg::I32(self as i32))
    }
}

/// A kernel's parameters in the C signature's order (declare with `kernel_args!`).
pub trait KernelArgs {
    const KINDS: &'static [ArgKind];
    const FIELDS: &'static [&'static str];
    /// The values in order; Err((field, value)) for a size that does not fit.
    fn kargs(&self) -> Result<Vec<KArg>, (&'static str, usize)>;
}

/// Declare the argument struct of one or more kernels sharing a C signature: the fields in
/// the signature's order, each a [`KernelArg`] (`DevPtr`, `Option<DevPtr>`, `i32`, `u32`,
/// `f32`, `bool`, `usize` for a C `int`).
#[macro_export]
macro_rules! kernel_args {
    ($(#[$m:meta])* $vis:vis struct $name:ident { $($(#[$fm:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug)]
        $vis struct $name { $($(#[$fm])* pub $field: $ty),* }
        impl $crate::backend::gpu::launch::KernelArgs for $name {
            const KINDS: &'static [$crate::backend::gpu::launch::ArgKind] =
                &[$(<$ty as $crate::backend::gpu::launch::KernelArg>::KIND),*];
            const FIELDS: &'static [&'static str] = &[$(stringify!($field)),*];
            fn kargs(&self) -> Result<Vec<$crate::backend::gpu::driver::KArg>, (&'static str, usize)> {
                Ok(vec![$($crate::backend::gpu::launch::KernelArg::karg(self.$field).map_err(|v| (stringify!($field), v))?),*])
            }
        }
    };
}

/// A kernel of a family, typed by its argument struct: launching it with other arguments
/// does not compile.
pub struct Kernel<A> {
    pub name: &'static str,
    args: PhantomData<fn(&A)>,
}

impl<A> Clone for Kernel<A> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<A> Copy for Kernel<A> {}
impl<A> std::fmt::Debug for Kernel<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl<A: KernelArgs> Kernel<A> {
    pub const fn new(name: &'static str) -> Self {
        Kernel { name, args: PhantomData }
    }
    /// The name and parameter kinds (a family's table lists these).
    pub const fn sig(self) -> KernelSig {
        KernelSig { name: self.name, args: A::KINDS }
    }
    pub fn launch(self, d: &dyn Launch, grid: [u32; 3], block: [u32; 3], args: &A) -> Result<(), GpuError> {
        let a = args.kargs().map_err(|(field, v)| GpuError::Unsupported(format!("{}: {field} = {v} does not fit the kernel's int", self.name)))?;
        Ok(d.launch(self.name, grid, block, &a)?)
    }
}

/// One exported kernel: its symbol and its parameter kinds.
#[derive(Clone, Copy, Debug)]
pub struct KernelSig {
    pub name: &'static str,
    pub args: &'static [ArgKind],
}

/// A kernel family: one `kernels-hip/<name>.hip` source and the Rust module of the same
/// name under `family/` that launches its kernels.
#[derive(Clone, Copy, Debug)]
pub struct Family {
    pub name: &'static str,
    pub source: &'static str,
    /// Its kernels, in groups (a launcher's table of kernels by type is one group).
    pub kernels: &'static [&'static [KernelSig]],
}

impl Family {
    pub fn sigs(&self) -> impl Iterator<Item = &'static KernelSig> + '_ {
        self.kernels.iter().flat_map(|g| g.iter())
    }
    pub fn kernel_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.sigs().map(|k| k.name)
    }
}

/// The activation blocks a quantized matvec reads (`kernels-hip/quantize.hip`), each
/// rounded as the CPU backend rounds the weight type's `vec_dot_type`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum ActFmt {
    /// 32-element q8_1 blocks: the codes and d of the CPU's q8_0 and q8_1 (Q4_0 … Q8_0).
    Q8_1,
    /// The codes and f32 scale of the CPU's q8_K, in 36-byte blocks (the K-quants).
    K,
}

impl ActFmt {
    /// Values per scale group (the `k` granularity the format needs).
    pub fn group(self) -> usize {
        match self {
            ActFmt::Q8_1 => 32,
            ActFmt::K => 256,
        }
    }
    /// The kernel flag (`kfmt`) of the fused producers: 1 for the K form.
    pub(crate) fn flag(self) -> bool {
        self == ActFmt::K
    }
}
