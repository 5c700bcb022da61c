//! Merging two partial attention results of the same query rows over disjoint key sets by their
//! LSEs on the CUDA engine (`cuda/merge.cu`, the twin of the wgpu engine's
//! [`encode_merge`](crate::runtime::forward::FlashAttention::encode_merge); the float64 definition is
//! `reference::merge_attention_states`): on device buffers, or on host slices.

use cudarc::driver::{CudaFunction, DevicePtr, DevicePtrMut, DeviceRepr, PushKernelArg};
use cudarc::nvrtc::Ptx;

use super::launch::{check_element_size, element_walk_launch, first_overlap, output_pointer, CudaAttention};
use super::nvrtc::{load_or_compile, CompileJob};
use crate::error::{check_holds, Error, Result};
use crate::problem::varlen::refuse_packed;
use crate::problem::{check_merge_inputs, AttentionProblem, DType, Element, Tensor, TensorLayout};
use crate::runtime::forward::AttentionOutput;

/// `struct MergeParams` of `cuda/merge.cu`, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct MergeParams {
    o_a: u64,
    o_b: u64,
    o: u64,
    lse_a: u64,
    lse_b: u64,
    /// 0: the merged LSE is not written.
    lse: u64,
    /// Element strides of o_a, o_b and o: batch, seq, head.
    strides: [[i64; 3]; 3],
    /// batch · seq_q · num_heads · head_dim.
    elements: i64,
    num_heads: i32,
    seq_q: i32,
    head_dim: i32,
    pad: i32,
}

const _: () = assert!(std::mem::size_of::<MergeParams>() == 144);

// SAFETY: plain `#[repr(C)]` data whose layout `cuda/merge.cu` mirrors (size asserted on both
// sides); passed by value as the kernel's only parameter.
unsafe impl DeviceRepr for MergeParams {}

/// The merge module's two entry points.
pub(super) struct LoadedMerge {
    f16: CudaFunction,
    bf16: CudaFunction,
}

/// The tensors of one merge in device memory ([`CudaAttention::merge_device`]), 16-bit elements
/// of the problem's dtype for the O tensors, all three at the problem's `o_layout`; the LSEs
/// `[batch, num_heads, seq_q]` f32, as the forward writes them (finite, or −∞ for a row that saw
/// no key). What is written (`o`, `lse`) must not overlap anything read or each other; the read
/// tensors may share memory.
pub struct MergeTensors<'a, T> {
    /// The first partial O.
    pub o_a: &'a dyn DevicePtr<T>,
    /// Its LSE.
    pub lse_a: &'a dyn DevicePtr<f32>,
    /// The second partial O.
    pub o_b: &'a dyn DevicePtr<T>,
    /// Its LSE.
    pub lse_b: &'a dyn DevicePtr<f32>,
    /// The merged O.
    pub o: &'a mut dyn DevicePtrMut<T>,
    /// The merged LSE, or `None` to skip writing it.
    pub lse: Option<&'a mut dyn DevicePtrMut<f32>>,
}

impl CudaAttention {
    fn merge_kernels(&self) -> Result<std::sync::Arc<LoadedMerge>> {
        self.merge_kernels.get_or_try_init(&(), || {
            let device = self.device();
            let job = CompileJob::merge(device.arch());
            let cache_dir = self.options().disk_cache.dir();
            let ctx = device.context();
            let fetched = load_or_compile(&job, cache_dir.as_deref(), device.driver_version(), |cubin| {
                let module = ctx.load_module(Ptx::from_binary(cubin.to_vec()))?;
                Ok(LoadedMerge {
                    f16: module.load_function("merge_f16")?,
                    bf16: module.load_function("merge_bf16")?,
                })
            })?;
            Ok(fetched.value)
        })
    }

    /// Enqueues the merge of two partial results on the engine's stream, on device buffers (no
    /// copies, no synchronization): for each row of `[batch, num_heads, seq_q]`,
    /// `lse = log(exp(lse_a) + exp(lse_b))` (computed from the larger) and
    /// `o = exp(lse_a − lse)·o_a + exp(lse_b − lse)·o_b`; a side with LSE −∞ has weight 0 and both
    /// −∞ give `o = 0`, `lse = −∞`. Of `problem`, only batch, num_heads, seq_q, head_dim, the
    /// dtype (f16 or bf16) and `o_layout` matter. Nothing is launched on an error (the problem's;
    /// a buffer too short, of the wrong element size, or written while read:
    /// [`Error::InvalidBuffer`]).
    pub fn merge_device<T>(&self, problem: &AttentionProblem, t: MergeTensors<'_, T>) -> Result<()> {
        self.merge_laid_out(problem, [problem.o_layout; 3], t)
    }

    /// [`merge_device`](Self::merge_device) with each O at its own layout (`o_a`, `o_b`, `o`):
    /// the ring merges chunk-sized scratch into views of the caller's O (src/cuda/ring.rs).
    pub(super) fn merge_laid_out<T>(
        &self,
        problem: &AttentionProblem,
        layouts: [TensorLayout; 3],
        t: MergeTensors<'_, T>,
    ) -> Result<()> {
        check_merge_problem(problem)?;
        check_element_size::<T>(problem, "o_a")?;
        let [len_a, len_b, len_o] = layouts.map(|l| o_len(problem, l));
        let rows = problem.lse_len();
        check_holds([
            ("o_a", t.o_a.len(), len_a),
            ("lse_a", t.lse_a.len(), rows),
            ("o_b", t.o_b.len(), len_b),
            ("lse_b", t.lse_b.len(), rows),
            ("o", t.o.len(), len_o),
            ("lse", t.lse.as_ref().map_or(rows, |l| l.len()), rows),
        ])?;
        let kernels = self.merge_kernels()?;
        let stream = self.device().stream();
        // Each guard orders the launch after earlier writes to its buffer (cudarc's bookkeeping).
        let (o_a, _ga) = t.o_a.device_ptr(stream);
        let (lse_a, _gla) = t.lse_a.device_ptr(stream);
        let (o_b, _gb) = t.o_b.device_ptr(stream);
        let (lse_b, _glb) = t.lse_b.device_ptr(stream);
        let (o, _go) = t.o.device_ptr_mut(stream);
        let (lse, _glse) = output_pointer(t.lse, stream);
        check_merge_apart(problem, layouts, [o_a, o_b, o], [lse_a, lse_b, lse])?;
        let params = merge_params(problem, layouts, [o_a, o_b, o], [lse_a, lse_b, lse]);
        let function = if problem.dtype == DType::BF16 {
            &kernels.bf16
        } else {
            &kernels.f16
        };
        let mut builder = stream.launch_builder(function);
        builder.arg(&params);
        // SAFETY: the parameter block matches the kernel's (size asserted on both sides); each
        // buffer was checked to hold the extent the O layout and the row count reach, and what
        // the kernel writes overlaps nothing it reads.
        unsafe { builder.launch(element_walk_launch(params.elements as u64)) }?;
        Ok(())
    }

    /// [`merge_device`](Self::merge_device) on host slices: uploads the two partial results
    /// (`o_a`, `o_b` at the problem's `o_layout`, `lse_a`, `lse_b` f32 `[batch, num_heads,
    /// seq_q]`), merges them, waits and reads O and the LSE back (`kernel` is `merge_{dtype}`;
    /// O elements the layout skips are 0).
    pub fn merge<T: Element>(
        &self,
        problem: &AttentionProblem,
        o_a: &[T],
        lse_a: &[f32],
        o_b: &[T],
        lse_b: &[f32],
    ) -> Result<AttentionOutput<T>> {
        check_merge_problem(problem)?;
        check_merge_inputs(problem, o_a, lse_a, o_b, lse_b)?;
        let (o_len, rows) = (problem.required_len(Tensor::O), problem.lse_len());
        let stream = self.device().stream();
        // bf16/f16 travel as their bit patterns: cudarc's DeviceRepr covers u16, not half's types.
        let bits = |x: &[T]| stream.clone_htod(bytemuck::cast_slice::<T, u16>(&x[..o_len]));
        let (d_o_a, d_o_b) = (bits(o_a)?, bits(o_b)?);
        let d_lse_a = stream.clone_htod(&lse_a[..rows])?;
        let d_lse_b = stream.clone_htod(&lse_b[..rows])?;
        let mut d_o = stream.alloc_zeros::<u16>(o_len)?;
        let mut d_lse = stream.alloc_zeros::<f32>(rows)?;
        self.merge_device(
            problem,
            MergeTensors {
                o_a: &d_o_a,
                lse_a: &d_lse_a,
                o_b: &d_o_b,
                lse_b: &d_lse_b,
                o: &mut d_o,
                lse: Some(&mut d_lse),
            },
        )?;
        let out_bits: Vec<u16> = stream.clone_dtoh(&d_o)?;
        let lse = stream.clone_dtoh(&d_lse)?;
        Ok(AttentionOutput {
            out: bytemuck::cast_slice::<u16, T>(&out_bits).to_vec(),
            lse,
            kernel: format!("merge_{}", problem.dtype.name()),
            device_bytes: 2 * (3 * o_len as u64) + 4 * (3 * rows as u64),
        })
    }
}

/// The problem a merge can run: valid, not packed, 16-bit (the CUDA engine's element types).
fn check_merge_problem(problem: &AttentionProblem) -> Result<()> {
    problem.validate()?;
    refuse_packed(problem, "the merge")?;
    if !matches!(problem.dtype, DType::F16 | DType::BF16) {
        return Err(Error::Unavailable {
            what: "the CUDA merge".into(),
            why: format!("it merges f16 or bf16 outputs, not {}", problem.dtype.name()),
        });
    }
    Ok(())
}

/// Refuses a merge whose written tensors (`o`, and `lse` unless its address is 0) overlap each
/// other or a read one, by the byte extents the problem reaches from each address (O tensors:
/// o_a, o_b, o at their `layouts`; LSEs: lse_a, lse_b, lse).
fn check_merge_apart(
    problem: &AttentionProblem,
    layouts: [TensorLayout; 3],
    [o_a, o_b, o]: [u64; 3],
    [lse_a, lse_b, lse]: [u64; 3],
) -> Result<()> {
    let [bytes_a, bytes_b, bytes_o] = layouts.map(|l| 2 * o_len(problem, l) as u64);
    let lse_bytes = 4 * problem.lse_len() as u64;
    let written = [("o", (o, o + bytes_o)), ("lse", (lse, lse + lse_bytes))];
    let written = if lse == 0 { &written[..1] } else { &written[..] };
    let read = [
        ("o_a", (o_a, o_a + bytes_a)),
        ("lse_a", (lse_a, lse_a + lse_bytes)),
        ("o_b", (o_b, o_b + bytes_b)),
        ("lse_b", (lse_b, lse_b + lse_bytes)),
    ];
    match first_overlap(written, &read) {
        Some((a, b)) => Err(Error::InvalidBuffer {
            tensor: a,
            message: format!(
                "its device memory overlaps `{b}`'s: the merge would overwrite what it reads (merge into a second \
                 buffer and swap)"
            ),
        }),
        None => Ok(()),
    }
}

/// Elements an O tensor of `problem`'s shape at `layout` spans from its buffer's start.
fn o_len(problem: &AttentionProblem, layout: TensorLayout) -> usize {
    AttentionProblem {
        o_layout: layout,
        ..*problem
    }
    .required_len(Tensor::O)
}

/// The kernel's parameter block for `problem` at the given device addresses (O tensors: o_a, o_b,
/// o, at their `layouts`; LSEs: lse_a, lse_b, lse or 0).
fn merge_params(
    problem: &AttentionProblem,
    layouts: [TensorLayout; 3],
    [o_a, o_b, o]: [u64; 3],
    [lse_a, lse_b, lse]: [u64; 3],
) -> MergeParams {
    let s = problem.shape;
    // Each layout's offset places its element 0; the kernel indexes from there.
    let [o_a, o_b, o] = [(o_a, 0), (o_b, 1), (o, 2)].map(|(base, i)| base + 2 * layouts[i].offset as u64);
    let strides = layouts.map(|l| [l.batch_stride as i64, l.seq_stride as i64, l.head_stride as i64]);
    MergeParams {
        o_a,
        o_b,
        o,
        lse_a,
        lse_b,
        lse,
        strides,
        elements: (s.batch * s.seq_q * s.num_heads * s.head_dim) as i64,
        num_heads: s.num_heads as i32,
        seq_q: s.seq_q as i32,
        head_dim: s.head_dim as i32,
        pad: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::TensorLayout;

    #[test]
    fn parameters_place_element_zero_and_count_every_element() {
        let layout = TensorLayout {
            offset: 10,
            batch_stride: 1000,
            seq_stride: 100,
            head_stride: 20,
        };
        let problem = AttentionProblem::mha(2, 3, 4, 16, DType::BF16).with_tensor_layout(Tensor::O, layout);
        let p = merge_params(
            &problem,
            [layout; 3],
            [1 << 20, 2 << 20, 3 << 20],
            [4 << 20, 5 << 20, 0],
        );
        assert_eq!((p.o_a, p.o_b, p.o), ((1 << 20) + 20, (2 << 20) + 20, (3 << 20) + 20));
        assert_eq!((p.lse_a, p.lse_b, p.lse), (4 << 20, 5 << 20, 0));
        assert_eq!(p.strides, [[1000, 100, 20]; 3]);
        // Each O at its own layout: a dense scratch chunk merged into a view of a larger O.
        let dense = TensorLayout::contiguous(crate::problem::Layout::Bshd, 3, 4, 16);
        let p = merge_params(&problem, [dense, dense, layout], [0, 0, 0], [0, 0, 0]);
        assert_eq!((p.o_a, p.o_b, p.o), (0, 0, 20));
        assert_eq!(p.strides, [[192, 64, 16], [192, 64, 16], [1000, 100, 20]]);
        assert_eq!(p.elements, 2 * 3 * 4 * 16);
        assert_eq!((p.num_heads, p.seq_q, p.head_dim), (4, 3, 16));
    }

    #[test]
    fn written_tensors_must_not_overlap_read_ones() {
        // O: 2·(1·8·2·16) = 512 bytes; LSE: 4·16 = 64 bytes.
        let p = AttentionProblem::mha(1, 8, 2, 16, DType::F16);
        let apart = |o, lse| check_merge_apart(&p, [p.o_layout; 3], [0, 1000, o], [2000, 3000, lse]);
        assert!(apart(4000, 5000).is_ok());
        assert!(apart(4000, 0).is_ok(), "no LSE written");
        assert!(apart(4000, 4512).is_ok(), "O and LSE side by side");
        let refused = |r: Result<()>| match r {
            Err(Error::InvalidBuffer { tensor, message }) => (tensor, message),
            other => panic!("expected a refusal, got {other:?}"),
        };
        let (tensor, message) = refused(apart(511, 5000));
        assert_eq!(tensor, "o");
        assert!(message.contains("`o_a`"), "{message}");
        assert_eq!(refused(apart(4000, 3063)).0, "lse");
        assert_eq!(refused(apart(4000, 4511)).0, "o", "O overlaps the LSE written");
        assert!(apart(4000, 3064).is_ok());
    }

    #[test]
    fn only_unpacked_16_bit_problems_merge() {
        assert!(check_merge_problem(&AttentionProblem::mha(1, 4, 2, 16, DType::F16)).is_ok());
        let e = check_merge_problem(&AttentionProblem::mha(1, 4, 2, 16, DType::F32)).unwrap_err();
        assert!(e.to_string().contains("f16 or bf16"), "{e}");
    }
}
