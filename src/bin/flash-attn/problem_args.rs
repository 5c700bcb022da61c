//! The flags that describe attention problems, shared by `check` and `bench` so that both spell a
//! shape the same way. Every flag is optional: each subcommand supplies its own defaults
//! ([`ProblemDefaults`]), and comma lists (`--seq 1024,4096`) sweep.

use clap::{Args, ValueEnum};
use wgpu_flash_attn::batch::{Alibi, BiasLayout, ScoreBias};
use wgpu_flash_attn::{AttentionProblem, AttentionShape, DType, Layout, Tensor, TensorLayout};

#[derive(Args, Clone, Debug, Default)]
pub struct ProblemArgs {
    /// Batch size.
    #[arg(long, value_name = "N")]
    pub batch: Option<usize>,
    /// Query heads.
    #[arg(long, value_name = "N")]
    pub heads: Option<usize>,
    /// Key/value heads, dividing --heads (fewer: grouped-query attention) [default: --heads].
    #[arg(long, value_name = "N")]
    pub kv_heads: Option<usize>,
    /// Query sequence lengths; a comma list sweeps.
    #[arg(long = "seq", visible_alias = "seq-q", value_name = "LEN,..", value_delimiter = ',')]
    pub seq_q: Vec<usize>,
    /// Key/value sequence length [default: the query length].
    #[arg(long, value_name = "LEN")]
    pub seq_kv: Option<usize>,
    /// Head dimensions (multiples of 8 up to 256); a comma list sweeps.
    #[arg(
        long = "head-dim",
        visible_alias = "head-dims",
        value_name = "D,..",
        value_delimiter = ','
    )]
    pub head_dim: Vec<usize>,
    /// Element types in memory; a comma list sweeps.
    #[arg(long, value_name = "TYPE,..", value_delimiter = ',')]
    pub dtype: Vec<DTypeArg>,
    /// Causal mask (bottom-right aligned when seq-q != seq-kv); `--causal` alone means yes.
    #[arg(long, value_name = "WHICH", num_args = 0..=1, default_missing_value = "yes")]
    pub causal: Option<CausalArg>,
    /// Memory order of Q, K, V and O: FlashAttention's [batch, seq, heads, dim] or PyTorch's
    /// [batch, heads, seq, dim].
    #[arg(long, value_enum)]
    pub layout: Option<LayoutArg>,
    /// Sliding window: the keys left of each query's position it sees (FlashAttention's
    /// window_size[0]) [default: unbounded].
    #[arg(long, value_name = "KEYS")]
    pub window_left: Option<usize>,
    /// Sliding window: the keys right of each query's position it sees, without --causal
    /// (window_size[1]) [default: unbounded].
    #[arg(long, value_name = "KEYS")]
    pub window_right: Option<usize>,
    /// Soft-cap the scores at CAP: cap·tanh(score / cap) (Gemma 2).
    #[arg(long, value_name = "CAP")]
    pub softcap: Option<f32>,
    /// ALiBi position bias: the standard geometric slopes, or random per-head slopes from a tensor.
    #[arg(long, value_enum)]
    pub alibi: Option<AlibiArg>,
    /// Attention sinks: a random logit per query head joins every row's softmax denominator.
    #[arg(long)]
    pub sinks: bool,
    /// An additive score bias of this element type, one [seq_q, seq_kv] matrix per head (broadcast
    /// over the batch), with random values.
    #[arg(long, value_name = "TYPE")]
    pub bias: Option<DTypeArg>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlibiArg {
    Geometric,
    PerHead,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DTypeArg {
    F32,
    F16,
    Bf16,
}

impl DTypeArg {
    pub fn dtype(self) -> DType {
        match self {
            DTypeArg::F32 => DType::F32,
            DTypeArg::F16 => DType::F16,
            DTypeArg::Bf16 => DType::BF16,
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CausalArg {
    No,
    Yes,
    /// Each problem both ways, non-causal first.
    Both,
}

impl CausalArg {
    fn values(self) -> &'static [bool] {
        match self {
            CausalArg::No => &[false],
            CausalArg::Yes => &[true],
            CausalArg::Both => &[false, true],
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutArg {
    Bshd,
    Bhsd,
}

/// What a subcommand assumes for the flags left out.
pub struct ProblemDefaults {
    pub batch: usize,
    pub heads: usize,
    /// `None`: as many as `heads`.
    pub kv_heads: Option<usize>,
    /// `(seq_q, seq_kv)` pairs.
    pub seqs: Vec<(usize, usize)>,
    pub head_dims: Vec<usize>,
    pub dtypes: Vec<DType>,
    pub causal: CausalArg,
}

impl ProblemArgs {
    /// Every problem the flags describe, over `defaults` where a flag is left out: dtype, then
    /// head_dim, then sequence lengths, then causal, varying fastest last.
    pub fn problems(&self, defaults: &ProblemDefaults) -> Vec<AttentionProblem> {
        let dtypes: Vec<DType> = if self.dtype.is_empty() {
            defaults.dtypes.clone()
        } else {
            self.dtype.iter().map(|d| d.dtype()).collect()
        };
        let head_dims = if self.head_dim.is_empty() {
            &defaults.head_dims
        } else {
            &self.head_dim
        };
        let seqs: Vec<(usize, usize)> = if self.seq_q.is_empty() {
            let kv = |default_kv| self.seq_kv.unwrap_or(default_kv);
            defaults.seqs.iter().map(|&(q, k)| (q, kv(k))).collect()
        } else {
            self.seq_q.iter().map(|&q| (q, self.seq_kv.unwrap_or(q))).collect()
        };
        let heads = self.heads.unwrap_or(defaults.heads);
        let layout = match self.layout {
            Some(LayoutArg::Bhsd) => Layout::Bhsd,
            Some(LayoutArg::Bshd) | None => Layout::Bshd,
        };
        let mut problems = Vec::new();
        for &dtype in &dtypes {
            for &head_dim in head_dims {
                for &(seq_q, seq_kv) in &seqs {
                    for &causal in self.causal.unwrap_or(defaults.causal).values() {
                        let shape = AttentionShape {
                            batch: self.batch.unwrap_or(defaults.batch),
                            seq_q,
                            seq_kv,
                            num_heads: heads,
                            num_kv_heads: self.kv_heads.or(defaults.kv_heads).unwrap_or(heads),
                            head_dim,
                        };
                        let mut p = AttentionProblem::new(shape, dtype)
                            .with_causal(causal)
                            .with_layout(layout);
                        if self.window_left.is_some() || self.window_right.is_some() {
                            p = p.with_window(self.window_left, self.window_right);
                        }
                        if let Some(cap) = self.softcap {
                            p = p.with_softcap(cap);
                        }
                        p.alibi = self.alibi.map(|a| match a {
                            AlibiArg::Geometric => Alibi::Geometric,
                            AlibiArg::PerHead => Alibi::PerHead,
                        });
                        if self.sinks {
                            p = p.with_sinks();
                        }
                        if let Some(dtype) = self.bias {
                            p = p.with_bias(ScoreBias {
                                dtype: dtype.dtype(),
                                layout: BiasLayout::dense(&p, false, true),
                            });
                        }
                        problems.push(p);
                    }
                }
            }
        }
        problems
    }
}

/// The memory order of a problem built by [`ProblemArgs::problems`].
pub fn layout_of(problem: &AttentionProblem) -> Layout {
    let s = problem.shape;
    let bhsd = TensorLayout::contiguous(Layout::Bhsd, s.seq_q, s.num_heads, s.head_dim);
    if *problem.layout(Tensor::Q) == bhsd {
        Layout::Bhsd
    } else {
        Layout::Bshd
    }
}

/// `b1 h8/8 1024x1024 d64` (heads as query/key-value): the shape in one short column.
pub fn shape_label(problem: &AttentionProblem) -> String {
    let s = problem.shape;
    format!(
        "b{} h{}/{} {}x{} d{}",
        s.batch, s.num_heads, s.num_kv_heads, s.seq_q, s.seq_kv, s.head_dim
    )
}

/// `batch 1, heads 8/8 (q/kv), seq 1024x1024, head_dim 64, f32, non-causal, bshd`, then the
/// window, soft-cap, ALiBi, sinks, bias and dropout where the problem has them.
pub fn describe(problem: &AttentionProblem) -> String {
    let s = problem.shape;
    let mut text = format!(
        "batch {}, heads {}/{} (q/kv), seq {}x{}, head_dim {}, {}, {}, {}",
        s.batch,
        s.num_heads,
        s.num_kv_heads,
        s.seq_q,
        s.seq_kv,
        s.head_dim,
        problem.dtype.name(),
        if problem.causal { "causal" } else { "non-causal" },
        layout_name(layout_of(problem)),
    );
    if let Some(w) = problem.window {
        let side = |x: Option<usize>| x.map_or("unbounded".to_string(), |k| k.to_string());
        text += &format!(", window {}/{}", side(w.left), side(w.right));
    }
    if let Some(cap) = problem.softcap {
        text += &format!(", softcap {cap}");
    }
    if let Some(alibi) = problem.alibi {
        text += &format!(", ALiBi {alibi:?}");
    }
    if problem.sinks {
        text += ", sinks";
    }
    if let Some(bias) = problem.bias {
        text += &format!(", {} bias per head", bias.dtype.name());
    }
    if let Some(d) = problem.dropout {
        text += &format!(", dropout {}", d.p);
    }
    text
}

pub fn layout_name(layout: Layout) -> &'static str {
    match layout {
        Layout::Bshd => "bshd",
        Layout::Bhsd => "bhsd",
    }
}

/// Runs `$body` with `$T` bound to the element type of `$dtype` (the harness is generic over it).
macro_rules! with_element {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            wgpu_flash_attn::DType::F32 => {
                type $T = f32;
                $body
            }
            wgpu_flash_attn::DType::F16 => {
                type $T = half::f16;
                $body
            }
            wgpu_flash_attn::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
        }
    };
}
pub(crate) use with_element;
