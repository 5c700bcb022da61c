//! From a caller's buffer and a tensor layout to a checked storage binding.

use crate::caps::Caps;
use crate::error::{Error, Result};
use crate::problem::{TensorLayout, ELEMENT_ALIGNMENT};
use crate::util::lcm;
use crate::wgsl::params::TensorStrides;

/// A tensor in a caller's GPU buffer: the buffer and the byte offset of the tensor's element 0
/// (its [`TensorLayout`] offset is counted from there).
#[derive(Clone, Copy, Debug)]
pub struct TensorBuffer<'a> {
    /// The buffer; it needs `BufferUsages::STORAGE`.
    pub buffer: &'a wgpu::Buffer,
    /// Bytes from the buffer's start to the tensor's element 0; a multiple of 4 elements' bytes
    /// (the LSE's: of the device's `min_storage_buffer_offset_alignment`).
    pub byte_offset: u64,
}

impl<'a> TensorBuffer<'a> {
    /// The tensor at the start of `buffer`.
    pub fn new(buffer: &'a wgpu::Buffer) -> Self {
        TensorBuffer { buffer, byte_offset: 0 }
    }

    /// The tensor at `byte_offset` bytes into `buffer` (several tensors in one buffer).
    pub fn at(buffer: &'a wgpu::Buffer, byte_offset: u64) -> Self {
        TensorBuffer { buffer, byte_offset }
    }
}

/// A validated binding: the byte range to bind and where the tensor starts inside it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bound<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub start: u64,
    pub size: u64,
    /// Byte offset of the tensor's first element in the buffer; with `start + size`, the bytes the
    /// tensor spans (the binding may begin earlier, at an aligned offset).
    pub first: u64,
    /// Offset and strides of the tensor relative to `start`, in granules.
    pub strides: TensorStrides,
}

impl Bound<'_> {
    /// The byte range the tensor spans in its buffer.
    pub fn span(&self) -> std::ops::Range<u64> {
        self.first..self.start + self.size
    }

    pub fn entry(&self, binding: u32) -> wgpu::BindGroupEntry<'_> {
        wgpu::BindGroupEntry {
            binding,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: self.buffer,
                offset: self.start,
                size: std::num::NonZeroU64::new(self.size),
            }),
        }
    }
}

/// Checks the buffer's usage and that it reaches `end` bytes.
fn check_extent(name: &'static str, tensor: &TensorBuffer<'_>, end: u64, what: String) -> Result<()> {
    let bad = |message: String| Error::InvalidBuffer { tensor: name, message };
    if !tensor.buffer.usage().contains(wgpu::BufferUsages::STORAGE) {
        return Err(bad("the buffer was not created with BufferUsages::STORAGE".into()));
    }
    if end > tensor.buffer.size() {
        return Err(bad(format!(
            "needs bytes up to {end} (byte offset {} + {what}), the buffer has {}",
            tensor.byte_offset,
            tensor.buffer.size()
        )));
    }
    Ok(())
}

pub(crate) fn check_binding_size(name: &'static str, size: u64, caps: &Caps) -> Result<()> {
    if size > caps.max_storage_binding_bytes {
        return Err(Error::TooLarge(format!(
            "tensor `{name}` spans {size} bytes, more than this device binds at once ({} bytes)",
            caps.max_storage_binding_bytes
        )));
    }
    Ok(())
}

/// Refuses, before anything is allocated, a buffer of `bytes` for tensor `name` that the device
/// cannot create (wgpu would report it to the device's uncaptured-error handler, which panics by
/// default). The host-slice paths call this for every buffer they create.
pub(crate) fn check_buffer_size(name: &'static str, bytes: u64, caps: &Caps) -> Result<()> {
    if bytes > caps.max_buffer_bytes {
        return Err(Error::TooLarge(format!(
            "tensor `{name}` needs a buffer of {bytes} bytes, more than this device allocates at once ({} bytes)",
            caps.max_buffer_bytes
        )));
    }
    Ok(())
}

/// Bytes of `len` elements of `elem_bytes` each, refused if that overflows a `u64` (`usize` may be
/// 32 bits: the product is formed in 64).
pub(crate) fn byte_len(name: &'static str, len: usize, elem_bytes: usize) -> Result<u64> {
    (len as u64).checked_mul(elem_bytes as u64).ok_or_else(|| {
        Error::TooLarge(format!(
            "tensor `{name}`: {len} elements of {elem_bytes} bytes overflow a 64-bit size"
        ))
    })
}

/// Refuses a written tensor that shares a buffer with a tensor the same dispatch reads: wgpu
/// (and WebGPU) forbid one buffer bound both read-only and writable in a dispatch. `written`
/// entries that are `None` (an optional output not asked for) are skipped.
pub(crate) fn check_written_apart_from_read(
    written: &[(&'static str, Option<&TensorBuffer<'_>>)],
    read: &[(&str, Option<&TensorBuffer<'_>>)],
) -> Result<()> {
    for &(name, w) in written {
        let Some(w) = w else { continue };
        for &(input, r) in read {
            if r.is_some_and(|r| r.buffer == w.buffer) {
                return Err(Error::InvalidBuffer {
                    tensor: name,
                    message: format!(
                        "shares a buffer with `{input}`; wgpu forbids reading and writing one buffer in a dispatch"
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Refuses two tensors whose byte ranges overlap in one buffer, where `a` is written: the kernels
/// would overwrite the other tensor (or each other's results) without any error from wgpu, which
/// only forbids read-only and writable bindings of one buffer in the same dispatch.
pub(crate) fn check_disjoint(a_name: &'static str, a: &Bound<'_>, b_name: &str, b: &Bound<'_>) -> Result<()> {
    let (x, y) = (a.span(), b.span());
    if a.buffer == b.buffer && x.start < y.end && y.start < x.end {
        return Err(Error::InvalidBuffer {
            tensor: a_name,
            message: format!(
                "its bytes {}..{} overlap those of `{b_name}` ({}..{}) in the same buffer; the kernels \
                 write `{a_name}`",
                x.start, x.end, y.start, y.end
            ),
        });
    }
    Ok(())
}

/// Checks that `tensor` holds `len_elems` elements of `elem_bytes` each at `layout` and returns
/// the smallest aligned binding that covers them.
///
/// The binding starts at the tensor's first element rounded down to the device's storage-offset
/// alignment, so a tensor deep inside a large buffer only needs its own extent to fit in one
/// binding.
pub(crate) fn bind<'a>(
    name: &'static str,
    tensor: &TensorBuffer<'a>,
    layout: &TensorLayout,
    len_elems: usize,
    elem_bytes: usize,
    caps: &Caps,
) -> Result<Bound<'a>> {
    let granule = (ELEMENT_ALIGNMENT * elem_bytes) as u64;
    if !tensor.byte_offset.is_multiple_of(granule) {
        return Err(Error::InvalidBuffer {
            tensor: name,
            message: format!(
                "byte offset {} is not a multiple of {granule} (four elements)",
                tensor.byte_offset
            ),
        });
    }
    let past_u64 = || Error::InvalidBuffer {
        tensor: name,
        message: format!(
            "byte offset {} plus {len_elems} elements of {elem_bytes} bytes overflows a 64-bit offset",
            tensor.byte_offset
        ),
    };
    let first = byte_len(name, layout.offset, elem_bytes)?
        .checked_add(tensor.byte_offset)
        .ok_or_else(past_u64)?;
    let end = byte_len(name, len_elems, elem_bytes)?
        .checked_add(tensor.byte_offset)
        .ok_or_else(past_u64)?;
    check_extent(name, tensor, end, format!("{len_elems} elements of {elem_bytes} bytes"))?;
    let start = binding_start(first, elem_bytes, caps);
    check_binding_size(name, end - start, caps)?;
    Ok(Bound {
        buffer: tensor.buffer,
        start,
        size: end - start,
        first,
        strides: TensorStrides::new(layout, ((first - start) / elem_bytes as u64) as usize),
    })
}

/// Where the binding of a tensor whose first element is at byte `first` starts: rounded down to a
/// multiple of both the device's storage-offset alignment and the tensor's granule (4 elements),
/// so that a tensor deep inside a large buffer only needs its own extent to fit in one binding.
pub(crate) fn binding_start(first: u64, elem_bytes: usize, caps: &Caps) -> u64 {
    let granule = (ELEMENT_ALIGNMENT * elem_bytes) as u64;
    let align = lcm(caps.min_storage_offset_alignment.max(1) as u64, granule);
    first / align * align
}

/// The alignment an f32 tensor's byte offset needs (it is bound exactly there): the device's
/// storage-offset alignment.
pub(crate) fn f32_offset_alignment(caps: &Caps) -> u64 {
    caps.min_storage_offset_alignment.max(4) as u64
}

/// Binding for `len` f32 values read or written whole (the LSE): bound exactly at its offset,
/// which must therefore meet the device's storage-offset alignment.
pub(crate) fn bind_f32<'a>(
    name: &'static str,
    tensor: &TensorBuffer<'a>,
    len: usize,
    caps: &Caps,
) -> Result<Bound<'a>> {
    let align = f32_offset_alignment(caps);
    if !tensor.byte_offset.is_multiple_of(align) {
        return Err(Error::InvalidBuffer {
            tensor: name,
            message: format!(
                "byte offset {} is not a multiple of the device's storage offset alignment {align}",
                tensor.byte_offset
            ),
        });
    }
    let size = byte_len(name, len, 4)?;
    let end = tensor
        .byte_offset
        .checked_add(size)
        .ok_or_else(|| Error::InvalidBuffer {
            tensor: name,
            message: format!(
                "byte offset {} plus {len} f32 values overflows a 64-bit offset",
                tensor.byte_offset
            ),
        })?;
    check_extent(name, tensor, end, format!("{len} f32 values"))?;
    check_binding_size(name, size, caps)?;
    Ok(Bound {
        buffer: tensor.buffer,
        start: tensor.byte_offset,
        size,
        first: tensor.byte_offset,
        strides: TensorStrides::default(),
    })
}
