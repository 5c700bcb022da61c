//! Uploading host data and reading results back, without blocking a browser's thread.

use wgpu::util::DeviceExt;

use crate::error::{Error, Result};

/// A storage buffer holding `data` (padded with zeros to a multiple of 4 bytes).
pub fn upload(device: &wgpu::Device, label: &str, data: &[u8], extra_usage: wgpu::BufferUsages) -> wgpu::Buffer {
    let padded;
    let contents = if data.len().is_multiple_of(4) && !data.is_empty() {
        data
    } else {
        padded = {
            let mut v = data.to_vec();
            v.resize(data.len().div_ceil(4).max(1) * 4, 0);
            v
        };
        &padded
    };
    device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some(label),
        contents,
        usage: wgpu::BufferUsages::STORAGE | extra_usage,
    })
}

/// Copies byte ranges `(buffer, offset, len)` (offsets and lengths multiples of 4) into one
/// mappable buffer, submits, and returns their bytes. Waits with `poll` on native backends;
/// on the web it only awaits the map callback, which the browser's event loop delivers.
pub async fn read_back(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    ranges: &[(&wgpu::Buffer, u64, u64)],
) -> Result<Vec<Vec<u8>>> {
    let total: u64 = ranges.iter().map(|r| r.2).sum();
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("wgpu-flash-attn read-back"),
        size: total.max(4),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("wgpu-flash-attn read-back"),
    });
    let mut at = 0;
    for &(buffer, offset, len) in ranges {
        if len > 0 {
            encoder.copy_buffer_to_buffer(buffer, offset, &staging, at, len);
        }
        at += len;
    }
    queue.submit([encoder.finish()]);

    let (sender, receiver) = futures_channel::oneshot::channel();
    staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
        let _ = sender.send(r);
    });
    #[cfg(not(target_arch = "wasm32"))]
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| Error::ReadBack(e.to_string()))?;
    receiver
        .await
        .map_err(|_| Error::ReadBack("the map callback was dropped (device lost?)".into()))?
        .map_err(|e| Error::ReadBack(e.to_string()))?;

    let mapped = staging
        .slice(..)
        .get_mapped_range()
        .map_err(|e| Error::ReadBack(e.to_string()))?;
    let mut out = Vec::with_capacity(ranges.len());
    let mut at = 0usize;
    for &(_, _, len) in ranges {
        out.push(mapped[at..at + len as usize].to_vec());
        at += len as usize;
    }
    drop(mapped);
    staging.unmap();
    Ok(out)
}
