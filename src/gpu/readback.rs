//! Uploading host data and reading results back, without blocking a browser's thread.

use std::time::Duration;

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

/// Like [`upload`], but fills the buffer through `queue` instead of a mapping at creation: on a
/// lost device that is an error for the device's handler (and the read-back), where wgpu's
/// `create_buffer_init` panics. The host-slice paths use it.
pub fn upload_queued(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    label: &str,
    data: &[u8],
    extra_usage: wgpu::BufferUsages,
) -> wgpu::Buffer {
    let align = wgpu::COPY_BUFFER_ALIGNMENT as usize;
    let buffer = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: data.len().div_ceil(align).max(1) as u64 * align as u64,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | extra_usage,
        mapped_at_creation: false,
    });
    let whole = data.len() / align * align;
    if whole > 0 {
        queue.write_buffer(&buffer, 0, &data[..whole]);
    }
    if whole < data.len() {
        let mut tail = data[whole..].to_vec();
        tail.resize(align, 0);
        queue.write_buffer(&buffer, whole as u64, &tail);
    }
    buffer
}

/// How long a read-back waits for the device on native backends unless told otherwise
/// (`Options::read_back_timeout`): generous, since a large problem on a slow device (lavapipe) can
/// run for many seconds, but finite, so that a device that never finishes is an error.
pub const DEFAULT_READ_BACK_TIMEOUT: Duration = Duration::from_secs(60);

/// [`read_back_within`] the [`DEFAULT_READ_BACK_TIMEOUT`].
pub async fn read_back(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    ranges: &[(&wgpu::Buffer, u64, u64)],
) -> Result<Vec<Vec<u8>>> {
    read_back_within(device, queue, ranges, DEFAULT_READ_BACK_TIMEOUT).await
}

/// Copies byte ranges `(buffer, offset, len)` (offsets and lengths multiples of 4) into mappable
/// staging buffers, submits, and returns their bytes. Each staging buffer stays within the
/// device's `max_buffer_size` (outputs that fit one by one may not fit together, and a range larger
/// than the limit is copied in pieces), so read-back never asks wgpu for a buffer it must refuse.
///
/// On native backends it waits in `device.poll` on the calling thread — in an `async` caller too:
/// wgpu delivers map callbacks only from a poll — for at most `timeout`, then gives up with
/// [`Error::ReadBack`] (the work may still be running; the staging buffers are released). The
/// timeout bounds that poll only: a driver may block in `queue.submit` itself (lavapipe does, for
/// as long as the earlier work runs), which no timeout here can cut short. On the web it only
/// awaits the map callbacks, which the browser's event loop delivers, and `timeout` is not used.
pub async fn read_back_within(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    ranges: &[(&wgpu::Buffer, u64, u64)],
    timeout: Duration,
) -> Result<Vec<Vec<u8>>> {
    let align = wgpu::COPY_BUFFER_ALIGNMENT;
    for &(buffer, offset, len) in ranges {
        let fits = offset.checked_add(len).is_some_and(|end| end <= buffer.size());
        if !offset.is_multiple_of(align) || !len.is_multiple_of(align) || !fits {
            return Err(Error::ReadBack(format!(
                "cannot copy bytes {offset}..+{len} of a {}-byte buffer (offsets and lengths must be multiples of {align})",
                buffer.size()
            )));
        }
    }
    // Pieces `(range, source offset, length)`, packed in order into staging buffers of at most
    // `limit` bytes each.
    let limit = (device.limits().max_buffer_size / align * align).max(align);
    let mut stagings: Vec<Vec<(usize, u64, u64)>> = vec![Vec::new()];
    let mut used = 0;
    for (index, &(_, offset, len)) in ranges.iter().enumerate() {
        let mut done = 0;
        while done < len {
            if used == limit {
                stagings.push(Vec::new());
                used = 0;
            }
            let piece = (len - done).min(limit - used);
            if let Some(staging) = stagings.last_mut() {
                staging.push((index, offset + done, piece));
            }
            used += piece;
            done += piece;
        }
    }

    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("wgpu-flash-attn read-back"),
    });
    let mut buffers = Vec::with_capacity(stagings.len());
    for pieces in &stagings {
        let size: u64 = pieces.iter().map(|p| p.2).sum();
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgpu-flash-attn read-back"),
            size: size.max(align),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut at = 0;
        for &(index, offset, len) in pieces {
            encoder.copy_buffer_to_buffer(ranges[index].0, offset, &staging, at, len);
            at += len;
        }
        buffers.push(staging);
    }
    let submission = queue.submit([encoder.finish()]);

    let mut receivers = Vec::with_capacity(buffers.len());
    for staging in &buffers {
        let (sender, receiver) = futures_channel::oneshot::channel();
        staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = sender.send(r);
        });
        receivers.push(receiver);
    }
    #[cfg(not(target_arch = "wasm32"))]
    device
        .poll(wgpu::PollType::Wait {
            submission_index: Some(submission),
            timeout: Some(timeout),
        })
        .map_err(|e| match e {
            wgpu::PollError::Timeout => Error::ReadBack(format!(
                "the device did not finish within {timeout:?} (Options::read_back_timeout); its work may still be running"
            )),
            e => Error::ReadBack(e.to_string()),
        })?;
    #[cfg(target_arch = "wasm32")]
    let _ = (submission, timeout);
    for receiver in receivers {
        receiver
            .await
            .map_err(|_| Error::ReadBack("the map callback was dropped (device lost?)".into()))?
            .map_err(|e| Error::ReadBack(e.to_string()))?;
    }

    let mut out: Vec<Vec<u8>> = ranges.iter().map(|r| Vec::with_capacity(r.2 as usize)).collect();
    for (staging, pieces) in buffers.iter().zip(&stagings) {
        let mapped = staging
            .slice(..)
            .get_mapped_range()
            .map_err(|e| Error::ReadBack(e.to_string()))?;
        let mut at = 0usize;
        for &(index, _, len) in pieces {
            out[index].extend_from_slice(&mapped[at..at + len as usize]);
            at += len as usize;
        }
        drop(mapped);
        staging.unmap();
    }
    Ok(out)
}
