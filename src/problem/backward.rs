//! What a backward call computes: the forward problem plus the layouts of the incoming gradient
//! dO and of the gradients dQ, dK, dV it produces, and whether it also computes the score bias's
//! gradient; and the validation every backward entry point runs before touching a GPU.

use crate::error::{Error, Result};
use crate::problem::score_bias::BiasLayout;
use crate::problem::{AttentionProblem, TensorLayout};

/// The four extra tensors of the backward pass, for messages and per-tensor layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradTensor {
    /// `dL/dO`, read; shaped like O.
    DO,
    /// `dL/dQ`, written; shaped like Q.
    DQ,
    /// `dL/dK`, written; shaped like K (`num_kv_heads` heads: summed over the query heads that share
    /// each K/V head).
    DK,
    /// `dL/dV`, written; shaped like V.
    DV,
}

impl GradTensor {
    /// The four, dO first.
    pub const ALL: [GradTensor; 4] = [GradTensor::DO, GradTensor::DQ, GradTensor::DK, GradTensor::DV];

    /// The name error messages use: `"d_o"`, `"dq"`, `"dk"`, `"dv"`.
    pub const fn name(self) -> &'static str {
        match self {
            GradTensor::DO => "d_o",
            GradTensor::DQ => "dq",
            GradTensor::DK => "dk",
            GradTensor::DV => "dv",
        }
    }

    /// Whether the backward pass writes this tensor.
    pub const fn is_output(self) -> bool {
        !matches!(self, GradTensor::DO)
    }
}

/// One backward call: the gradients of a loss `L` with respect to Q, K and V, given `dL/dO`, the
/// forward's inputs, its output O and its log-sum-exp.
///
/// `forward` describes the forward call exactly (shapes, dtype, causal, scale, the layouts of Q,
/// K, V and O); dO, dQ, dK and dV have their own [`TensorLayout`]s, by default those of O, Q, K and
/// V. All of them follow the forward's rules: offsets and strides multiples of 4 elements, and the
/// written tensors (dQ, dK, dV) must not overlap themselves — a K broadcast over the batch with a
/// zero stride needs a dK layout of its own.
///
/// Every backward entry point takes `impl Into<BackwardProblem>`, so an [`AttentionProblem`] whose
/// gradients are laid out like their tensors can be passed as it is. Here K and V are shared by
/// the whole batch, so dK and dV get dense layouts (one gradient per batch element, for the
/// caller to sum):
///
/// ```rust
/// use wgpu_flash_attn::{AttentionProblem, BackwardProblem, DType, GradTensor, Layout, Tensor, TensorLayout};
/// # fn main() -> wgpu_flash_attn::Result<()> {
/// let (batch, seq, heads, head_dim) = (4, 512, 8, 64);
/// let mut shared = TensorLayout::contiguous(Layout::Bshd, seq, heads, head_dim);
/// shared.batch_stride = 0; // every batch element reads the same K and V
/// let forward = AttentionProblem::mha(batch, seq, heads, head_dim, DType::F32)
///     .with_causal(true)
///     .with_tensor_layout(Tensor::K, shared)
///     .with_tensor_layout(Tensor::V, shared);
/// forward.validate()?; // inputs may broadcast
///
/// // By default dK would take K's layout, and its batch elements would overwrite each other.
/// assert!(BackwardProblem::new(forward).validate().is_err());
///
/// let dense = TensorLayout::contiguous(Layout::Bshd, seq, heads, head_dim);
/// let problem = BackwardProblem::new(forward)
///     .with_grad_layout(GradTensor::DK, dense)
///     .with_grad_layout(GradTensor::DV, dense);
/// problem.validate()?;
/// assert_eq!(problem.forward.required_len(Tensor::K), seq * heads * head_dim);
/// assert_eq!(problem.required_len(GradTensor::DK), batch * seq * heads * head_dim);
/// assert_eq!(problem.required_len(GradTensor::DQ), batch * seq * heads * head_dim);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackwardProblem {
    /// The forward call being differentiated, exactly as it ran.
    pub forward: AttentionProblem,
    /// Where dO is read; shaped like O.
    pub d_o_layout: TensorLayout,
    /// Where dQ is written; shaped like Q, must not overlap itself.
    pub dq_layout: TensorLayout,
    /// Where dK is written; shaped like K, must not overlap itself.
    pub dk_layout: TensorLayout,
    /// Where dV is written; shaped like V, must not overlap itself.
    pub dv_layout: TensorLayout,
    /// Whether the call also computes `dL/d(bias)` of the forward's score bias
    /// ([`with_bias_grad`](Self::with_bias_grad); laid out as [`d_bias_layout`](Self::d_bias_layout)
    /// says). `false` by default: a bias that needs no gradient (a mask, a frozen table) costs
    /// nothing more.
    pub bias_grad: bool,
}

impl BackwardProblem {
    /// The backward of `forward`, with each gradient laid out like the tensor it belongs to.
    pub fn new(forward: AttentionProblem) -> Self {
        BackwardProblem {
            forward,
            d_o_layout: forward.o_layout,
            dq_layout: forward.q_layout,
            dk_layout: forward.k_layout,
            dv_layout: forward.v_layout,
            bias_grad: false,
        }
    }

    /// Asks for (or not) the gradient of the forward's score bias
    /// ([`AttentionProblem::with_bias`]): `dL/d(bias)[b, h, i, j] = P ∘ (dP − D)` at `(i, j)` of
    /// the `(b, h)` it is added to, summed over the batch entries and heads the bias broadcasts
    /// over (a stride of 0 in its [`BiasLayout`]). It comes in f32, in the dense layout
    /// [`d_bias_layout`](Self::d_bias_layout) gives: on the caller's buffers in
    /// `BackwardBuffers::d_bias`, on host slices in `BackwardOutput::d_bias`. A problem without a
    /// bias cannot ask for it.
    pub fn with_bias_grad(mut self, bias_grad: bool) -> Self {
        self.bias_grad = bias_grad;
        self
    }

    /// Where `dL/d(bias)` lies when the call computes it ([`with_bias_grad`](Self::with_bias_grad)):
    /// a dense f32 `[batch | 1, num_heads | 1, seq_q, seq_kv]` tensor from element 0, with a
    /// batch (head) dimension exactly where the bias has a non-zero batch (head) stride
    /// ([`BiasLayout::dense`]; for a packed batch `seq_q` and `seq_kv` are the longest
    /// sequence's, and elements past a sequence's end are 0). Dense and f32 whatever the bias's
    /// own layout and type: its sums over the broadcast dimensions are formed in f32, its rows
    /// may be padded or overlap, and 16-bit values written two to a word by different workgroups
    /// would need atomics, which WGSL lacks for them. Elements the bias's layout aliases (two
    /// non-zero strides reaching one element) get one gradient each, for the caller to add.
    /// `None` when the call does not compute it.
    pub fn d_bias_layout(&self) -> Option<BiasLayout> {
        let bias = self.forward.bias.filter(|_| self.bias_grad)?;
        Some(BiasLayout::dense(
            &self.forward,
            bias.layout.batch_stride != 0,
            bias.layout.head_stride != 0,
        ))
    }

    /// `(batch entries, heads)` of `dL/d(bias)` when the call computes it: the problem's where the
    /// bias has a non-zero stride, 1 where it broadcasts.
    pub fn d_bias_extent(&self) -> Option<(usize, usize)> {
        let bias = self.forward.bias.filter(|_| self.bias_grad)?;
        let s = &self.forward.shape;
        let l = bias.layout;
        Some((
            if l.batch_stride != 0 { s.batch } else { 1 },
            if l.head_stride != 0 { s.num_heads } else { 1 },
        ))
    }

    /// f32 values of `dL/d(bias)` ([`d_bias_layout`](Self::d_bias_layout)); 0 when the call does
    /// not compute it. After validation this cannot overflow.
    pub fn d_bias_len(&self) -> usize {
        let Some((batch, heads)) = self.d_bias_extent() else {
            return 0;
        };
        let s = &self.forward.shape;
        [heads, s.seq_q, s.seq_kv]
            .iter()
            .try_fold(batch, |acc, &n| acc.checked_mul(n))
            .unwrap_or(usize::MAX)
    }

    /// Sets one gradient tensor's strides and offset.
    pub fn with_grad_layout(mut self, tensor: GradTensor, layout: TensorLayout) -> Self {
        *match tensor {
            GradTensor::DO => &mut self.d_o_layout,
            GradTensor::DQ => &mut self.dq_layout,
            GradTensor::DK => &mut self.dk_layout,
            GradTensor::DV => &mut self.dv_layout,
        } = layout;
        self
    }

    /// One gradient tensor's strides and offset.
    pub fn layout(&self, tensor: GradTensor) -> &TensorLayout {
        match tensor {
            GradTensor::DO => &self.d_o_layout,
            GradTensor::DQ => &self.dq_layout,
            GradTensor::DK => &self.dk_layout,
            GradTensor::DV => &self.dv_layout,
        }
    }

    /// `(seq, heads)` of a gradient tensor: dO and dQ have `seq_q` rows of `num_heads`, dK and dV
    /// `seq_kv` rows of `num_kv_heads`.
    pub fn extent(&self, tensor: GradTensor) -> (usize, usize) {
        let s = &self.forward.shape;
        match tensor {
            GradTensor::DO | GradTensor::DQ => (s.seq_q, s.num_heads),
            GradTensor::DK | GradTensor::DV => (s.seq_kv, s.num_kv_heads),
        }
    }

    /// `(batch, seq, heads)` of a gradient tensor as stored: [`extent`](Self::extent) with the
    /// batch, or for a packed batch `(1, total rows, heads)` like the tensor it is the gradient of.
    pub fn stored_extent(&self, tensor: GradTensor) -> (usize, usize, usize) {
        let (seq, heads) = self.extent(tensor);
        match (self.forward.varlen, tensor) {
            (Some(v), GradTensor::DO | GradTensor::DQ) => (1, v.total_q, heads),
            (Some(v), GradTensor::DK | GradTensor::DV) => (1, v.total_kv, heads),
            (None, _) => (self.forward.shape.batch, seq, heads),
        }
    }

    /// Elements a buffer holding `tensor` must have (after validation this cannot overflow).
    pub fn required_len(&self, tensor: GradTensor) -> usize {
        let (batch, seq, heads) = self.stored_extent(tensor);
        self.layout(tensor)
            .required_len(batch, seq, heads, self.forward.shape.head_dim)
            .unwrap_or(usize::MAX)
    }

    /// Floating-point operations by the usual convention: 2.5 × the forward's (FlashAttention's
    /// benchmarks count five `seq_q × seq_kv × head_dim` products against the forward's two; the
    /// recomputation of S and dP in the dQ pass is not counted).
    pub fn flops(&self) -> f64 {
        2.5 * self.forward.flops()
    }

    /// Checks everything that can be checked without a device: the forward problem, then each
    /// gradient tensor's layout. Every backward entry point calls this.
    pub fn validate(&self) -> Result<()> {
        self.forward.validate()?;
        for tensor in GradTensor::ALL {
            self.validate_layout(tensor)?;
        }
        if self.bias_grad {
            if self.forward.bias.is_none() {
                return crate::error::invalid!(
                    "the backward asks for the score bias's gradient (BackwardProblem::with_bias_grad), but the \
                     forward problem has no bias (AttentionProblem::with_bias)"
                );
            }
            // The kernel indexes d(bias) with u32.
            let len = self.d_bias_len();
            if len > u32::MAX as usize {
                return Err(Error::TooLarge(format!(
                    "the score bias's gradient has {len} elements, more than the kernels' 32-bit indexing reaches"
                )));
            }
        }
        Ok(())
    }

    fn validate_layout(&self, tensor: GradTensor) -> Result<()> {
        let (batch, seq, heads) = self.stored_extent(tensor);
        let s = &self.forward.shape;
        // Gradients default to their tensors' layouts, which may broadcast: say how to fix that.
        let written = tensor
            .is_output()
            .then_some("; give it a layout of its own with BackwardProblem::with_grad_layout");
        let kv = matches!(tensor, GradTensor::DK | GradTensor::DV);
        super::check_packed_batch_stride(&self.forward, tensor.name(), self.layout(tensor), kv)?;
        self.layout(tensor)
            .check(tensor.name(), (batch, seq, heads, s.head_dim), written)?;
        Ok(())
    }
}

impl From<AttentionProblem> for BackwardProblem {
    fn from(forward: AttentionProblem) -> Self {
        BackwardProblem::new(forward)
    }
}

impl From<&AttentionProblem> for BackwardProblem {
    fn from(forward: &AttentionProblem) -> Self {
        BackwardProblem::new(*forward)
    }
}

impl From<&BackwardProblem> for BackwardProblem {
    fn from(problem: &BackwardProblem) -> Self {
        *problem
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{AttentionShape, DType, Layout, Tensor};

    fn forward() -> AttentionProblem {
        AttentionProblem::new(
            AttentionShape {
                batch: 2,
                seq_q: 5,
                seq_kv: 7,
                num_heads: 4,
                num_kv_heads: 2,
                head_dim: 16,
            },
            DType::F32,
        )
    }

    #[test]
    fn gradients_default_to_the_layouts_of_their_tensors() {
        let f = forward().with_layout(Layout::Bhsd);
        let p = BackwardProblem::from(&f);
        assert_eq!(p.d_o_layout, f.o_layout);
        assert_eq!(p.dq_layout, f.q_layout);
        assert_eq!(p.dk_layout, f.k_layout);
        assert_eq!(p.dv_layout, f.v_layout);
        assert_eq!(p.required_len(GradTensor::DK), f.required_len(Tensor::K));
        assert_eq!(p.required_len(GradTensor::DO), f.required_len(Tensor::O));
        assert_eq!(p.flops(), 2.5 * f.flops());
        p.validate().unwrap();
    }

    #[test]
    fn validation_names_the_gradient_tensor() {
        let p = BackwardProblem::new(forward());
        let mut l = p.dv_layout;
        l.seq_stride = 6;
        let msg = p
            .with_grad_layout(GradTensor::DV, l)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(msg.contains("`dv`") && msg.contains("seq_stride 6"), "{msg}");

        // A forward problem that is itself invalid is reported as such.
        let mut bad = forward();
        bad.shape.num_kv_heads = 3;
        let msg = BackwardProblem::new(bad).validate().unwrap_err().to_string();
        assert!(msg.contains("num_kv_heads"), "{msg}");

        // K broadcast over the batch is a fine input, but its gradient would overlap itself.
        let mut k = forward().k_layout;
        k.batch_stride = 0;
        let f = forward().with_tensor_layout(Tensor::K, k);
        f.validate().unwrap();
        let msg = BackwardProblem::new(f).validate().unwrap_err().to_string();
        assert!(msg.contains("`dk`") && msg.contains("overlap"), "{msg}");
        let own = TensorLayout::contiguous(Layout::Bshd, 7, 2, 16);
        BackwardProblem::new(f)
            .with_grad_layout(GradTensor::DK, own)
            .validate()
            .unwrap();

        // dO is read: it may broadcast.
        let mut d_o = p.d_o_layout;
        d_o.batch_stride = 0;
        p.with_grad_layout(GradTensor::DO, d_o).validate().unwrap();
    }

    #[test]
    fn the_bias_gradient_follows_the_broadcast_of_the_bias() {
        use crate::problem::score_bias::{BiasLayout, ScoreBias};
        let f = forward();
        // Asked for without a bias: refused by name.
        let msg = BackwardProblem::new(f)
            .with_bias_grad(true)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(msg.contains("with_bias_grad") && msg.contains("no bias"), "{msg}");
        assert_eq!(BackwardProblem::new(f).d_bias_len(), 0);
        // [batch, seq, heads] = [2, 5 × 7, 4]: each broadcast keeps its dimensions, padded rows
        // and offsets of the bias do not change the gradient's dense layout.
        for (per_batch, per_head, len) in [
            (true, true, 2 * 4 * 35),
            (false, true, 4 * 35),
            (true, false, 2 * 35),
            (false, false, 35),
        ] {
            let dense = BiasLayout::dense(&f, per_batch, per_head);
            let padded = BiasLayout {
                offset: 3,
                row_stride: 9,
                head_stride: if per_head { 5 * 9 } else { 0 },
                batch_stride: if per_batch { 4 * 5 * 9 } else { 0 },
            };
            let with = |layout| {
                BackwardProblem::new(f.with_bias(ScoreBias {
                    dtype: DType::BF16,
                    layout,
                }))
            };
            assert_eq!(with(padded).d_bias_layout(), None, "not asked for");
            let p = with(padded).with_bias_grad(true);
            p.validate().unwrap();
            assert_eq!(p.d_bias_layout(), Some(dense));
            assert_eq!(p.d_bias_len(), len);
            let extent = p.d_bias_extent().unwrap();
            assert_eq!(extent, (if per_batch { 2 } else { 1 }, if per_head { 4 } else { 1 }));
        }
    }
}
