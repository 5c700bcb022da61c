//! What a backward call computes: the forward problem plus the layouts of the incoming gradient
//! dO and of the gradients dQ, dK, dV it produces; and the validation every backward entry point
//! runs before touching a GPU.

use crate::error::Result;
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
        }
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
}
