//! Scratch buffers an engine keeps between calls: created on first need, replaced by larger ones
//! when a call needs more, never shrunk. Calls recorded back to back may share them: wgpu orders
//! every use of a buffer written as storage with a barrier, within a command buffer and across
//! submissions to the queue.

use std::sync::Mutex;

/// `N` storage buffers grown together (the decode kernel's partial outputs and their LSEs).
pub(crate) struct ScratchBuffers<const N: usize> {
    labels: [&'static str; N],
    held: Mutex<Option<[wgpu::Buffer; N]>>,
}

impl<const N: usize> ScratchBuffers<N> {
    pub fn new(labels: [&'static str; N]) -> Self {
        ScratchBuffers {
            labels,
            held: Mutex::new(None),
        }
    }

    /// Buffers of at least `bytes[i]` bytes each (and at least 16, the smallest binding of a
    /// `vec4`), replacing smaller ones; work in flight keeps the old ones alive until it completes.
    pub fn at_least(&self, device: &wgpu::Device, bytes: [u64; N]) -> [wgpu::Buffer; N] {
        // A poisoned lock only means another call panicked between two assignments; the buffers
        // are whole either way.
        let mut held = self.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(buffers) = held.as_ref() {
            if buffers.iter().zip(bytes).all(|(b, need)| b.size() >= need) {
                return buffers.clone();
            }
        }
        let old: [u64; N] = std::array::from_fn(|i| held.as_ref().map_or(0, |b| b[i].size()));
        let fresh: [wgpu::Buffer; N] = std::array::from_fn(|i| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(self.labels[i]),
                size: bytes[i].max(old[i]).max(16),
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        });
        *held = Some(fresh.clone());
        fresh
    }
}
