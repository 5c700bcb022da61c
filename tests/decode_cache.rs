//! The decode kernel on paged K/V caches and per-sequence key counts, against
//! `reference::attention_indexed` (dense attention over each sequence's gathered keys, the causal
//! mask aligned to its own end): seeded random problems over page sizes 16/64/256, shuffled page
//! tables into pools larger than needed, ragged counts including 0, 1 and seq_kv, forced splits,
//! GQA 1/4/8, one or several new tokens, every dtype and both lane reductions; outputs poisoned
//! with NaN before the kernel runs. An index past the pool, or a count past seq_kv, on the
//! caller's buffers makes exactly that sequence's rows NaN; on host slices it is an error.

mod common;

use common::{below, gpu, shape, storage, submit_and_read};
use wgpu_flash_attn::batch::{BatchIndex, PagedKv};
use wgpu_flash_attn::gpu::readback::read_back;
use wgpu_flash_attn::kernel::{DecodeChoice, ForwardKernel, Reduction};
use wgpu_flash_attn::testing::harness::{nan_bytes, tolerance};
use wgpu_flash_attn::testing::{random_tensor, ErrorStats, Rng};
use wgpu_flash_attn::{
    reference, AttentionProblem, DType, Element, Error, FlashAttention, ForwardBuffers, GpuContext, KernelChoice,
    Layout, Options, Tensor, TensorBuffer,
};

/// A decode problem over a cache, its inputs and its index.
struct Case<T> {
    problem: AttentionProblem,
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    page_table: Option<Vec<u32>>,
    kv_lens: Option<Vec<u32>>,
    /// Bytes before K's element 0 in its buffer (a caller's byte offset).
    k_byte_offset: u64,
}

impl<T: Element> Case<T> {
    fn index(&self) -> BatchIndex<'_> {
        BatchIndex {
            page_table: self.page_table.as_deref(),
            kv_lens: self.kv_lens.as_deref(),
            ..Default::default()
        }
    }

    /// Runs on the caller's buffers with O and the LSE poisoned; returns them.
    fn run(&self, ctx: &GpuContext, engine: &FlashAttention) -> wgpu_flash_attn::Result<(Vec<T>, Vec<f32>)> {
        let p = &self.problem;
        let storage = |label, bytes: &[u8]| storage(ctx, label, bytes);
        let q = storage("q", bytemuck::cast_slice(&self.q));
        let mut k_bytes = vec![0u8; self.k_byte_offset as usize];
        k_bytes.extend_from_slice(bytemuck::cast_slice(&self.k));
        let k = storage("k", &k_bytes);
        let v = storage("v", bytemuck::cast_slice(&self.v));
        let o = storage("o", &nan_bytes(p.dtype, p.required_len(Tensor::O)));
        let lse = storage("lse", &nan_bytes(DType::F32, p.lse_len()));
        let table = self
            .page_table
            .as_ref()
            .map(|t| storage("page_table", bytemuck::cast_slice(t)));
        let lens = self
            .kv_lens
            .as_ref()
            .map(|l| storage("kv_lens", bytemuck::cast_slice(l)));
        let buffers = ForwardBuffers {
            page_table: table.as_ref().map(TensorBuffer::new),
            kv_lens: lens.as_ref().map(TensorBuffer::new),
            ..ForwardBuffers::new(
                TensorBuffer::new(&q),
                TensorBuffer {
                    buffer: &k,
                    byte_offset: self.k_byte_offset,
                },
                TensorBuffer::new(&v),
                TensorBuffer::new(&o),
                Some(TensorBuffer::new(&lse)),
            )
        };
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        engine.encode_forward(&mut encoder, p, &buffers, None)?;
        submit_and_read(ctx, encoder, &o, &lse)
    }

    /// Runs and compares with the reference; returns the kernel that ran.
    fn check(&self, ctx: &GpuContext, engine: &FlashAttention, label: &str) -> ForwardKernel {
        let kernel = engine.select(&self.problem).unwrap_or_else(|e| panic!("{label}: {e}"));
        let (out, lse) = self.run(ctx, engine).unwrap_or_else(|e| panic!("{label}: {e}"));
        let want = reference::attention_indexed(&self.problem, &self.q, &self.k, &self.v, &self.index()).unwrap();
        let o = ErrorStats::from_pairs(out.iter().map(|x| x.to_f64()).zip(want.out.iter().copied()));
        let l = ErrorStats::from_pairs(lse.iter().map(|&x| x as f64).zip(want.lse.iter().copied()));
        let tol = tolerance(self.problem.dtype);
        assert!(
            o.within(tol.out_rel_l2, tol.out_max_abs),
            "{label} ({}): O {o}",
            kernel.name()
        );
        assert!(l.within(1e-5, tol.lse_max_abs), "{label} ({}): LSE {l}", kernel.name());
        kernel
    }
}

/// A random cache problem: `pages` of `page_size` tokens, each sequence's pages a random subset
/// of a pool twice the need, counts ragged when `lengths`.
#[allow(clippy::too_many_arguments)]
fn case<T: Element>(
    rng: &mut Rng,
    dims: (usize, usize, usize, usize, usize, usize),
    dtype: DType,
    causal: bool,
    page_size: Option<usize>,
    lengths: bool,
    layout: Layout,
) -> Case<T> {
    let (batch, seq_q, seq_kv, heads, kv_heads, head_dim) = dims;
    let mut problem = AttentionProblem::new(shape(batch, seq_q, seq_kv, heads, kv_heads, head_dim), dtype)
        .with_causal(causal)
        .with_layout(layout)
        .with_kv_lengths(lengths);
    let mut page_table = None;
    if let Some(page_size) = page_size {
        let pages_per_seq = seq_kv.div_ceil(page_size);
        let num_pages = 2 * batch * pages_per_seq + 1;
        problem = problem.with_paged_kv(
            PagedKv {
                page_size,
                num_pages,
                pages_per_seq,
            },
            layout,
        );
        // A random permutation of the pool; its first entries are the sequences' pages.
        let mut pool: Vec<u32> = (0..num_pages as u32).collect();
        for i in (1..pool.len()).rev() {
            pool.swap(i, below(rng, i + 1));
        }
        page_table = Some(pool[..batch * pages_per_seq].to_vec());
    }
    let kv_lens = lengths.then(|| {
        (0..batch)
            .map(|b| match b % 4 {
                0 => seq_kv as u32,
                1 => 0,
                2 => 1,
                _ => below(rng, seq_kv + 1) as u32,
            })
            .collect()
    });
    let seed = rng.next_u64();
    let n = |t| problem.required_len(t);
    Case {
        q: random_tensor(seed, n(Tensor::Q)),
        k: random_tensor(seed + 1, n(Tensor::K)),
        v: random_tensor(seed + 2, n(Tensor::V)),
        problem,
        page_table,
        kv_lens,
        k_byte_offset: 0,
    }
}

fn engine(ctx: &GpuContext, splits: Option<u32>, reduction: Option<Reduction>) -> FlashAttention {
    FlashAttention::with_options(
        ctx,
        Options {
            choice: KernelChoice::Decode(DecodeChoice {
                splits,
                reduction,
                ..DecodeChoice::default()
            }),
            ..Options::default()
        },
    )
}

#[allow(clippy::too_many_arguments)]
fn check_any(
    rng: &mut Rng,
    ctx: &GpuContext,
    engine: &FlashAttention,
    dims: (usize, usize, usize, usize, usize, usize),
    dtype: DType,
    causal: bool,
    page_size: Option<usize>,
    lengths: bool,
    layout: Layout,
    label: &str,
) {
    let kernel = match dtype {
        DType::F32 => case::<f32>(rng, dims, dtype, causal, page_size, lengths, layout).check(ctx, engine, label),
        DType::F16 => case::<half::f16>(rng, dims, dtype, causal, page_size, lengths, layout).check(ctx, engine, label),
        DType::BF16 => {
            case::<half::bf16>(rng, dims, dtype, causal, page_size, lengths, layout).check(ctx, engine, label)
        }
    };
    assert!(
        matches!(kernel, ForwardKernel::Decode { .. }),
        "{label}: {}",
        kernel.name()
    );
}

#[test]
fn paged_caches_of_every_page_size_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(0x9a6e);
    for page_size in [16, 64, 256] {
        for (splits, lengths) in [(None, false), (Some(1), true), (Some(5), true), (None, true)] {
            let engine = engine(ctx, splits, None);
            let dims = (4, 1 + below(&mut rng, 4), 300 + below(&mut rng, 400), 8, 2, 64);
            let label = format!("page{page_size}_splits{splits:?}_lens{lengths}");
            check_any(
                &mut rng,
                ctx,
                &engine,
                dims,
                DType::F16,
                true,
                Some(page_size),
                lengths,
                Layout::Bshd,
                &label,
            );
        }
    }
}

#[test]
fn random_cache_problems() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(0xcac4e);
    let reductions: Vec<Option<Reduction>> = if ctx.caps.subgroups {
        vec![Some(Reduction::Subgroup), Some(Reduction::Workgroup)]
    } else {
        vec![Some(Reduction::Workgroup)]
    };
    for i in 0..16 {
        let group = [1, 4, 8][below(&mut rng, 3)];
        let kv_heads = 1 + below(&mut rng, 2);
        let dims = (
            1 + below(&mut rng, 5),
            [1, 1, 2, 4, 7][below(&mut rng, 5)],
            [1, 16, 17, 200, 1000][below(&mut rng, 5)],
            kv_heads * group,
            kv_heads,
            [8, 64, 128, 200][below(&mut rng, 4)],
        );
        let dtype = [DType::F32, DType::F16, DType::BF16][below(&mut rng, 3)];
        let page_size = [None, Some(16), Some(64), Some(256)][below(&mut rng, 4)];
        let lengths = below(&mut rng, 2) == 0 || page_size.is_none();
        let layout = [Layout::Bshd, Layout::Bhsd][below(&mut rng, 2)];
        let splits = [None, Some(1), Some(3), Some(64)][below(&mut rng, 4)];
        let engine = engine(ctx, splits, reductions[i % reductions.len()]);
        let causal = below(&mut rng, 3) != 0;
        let label = format!("case{i}_{dims:?}_{dtype:?}_page{page_size:?}_lens{lengths}_{layout:?}_splits{splits:?}");
        check_any(
            &mut rng, ctx, &engine, dims, dtype, causal, page_size, lengths, layout, &label,
        );
    }
}

#[test]
fn an_invalid_index_poisons_exactly_its_sequence_or_is_refused_on_the_host() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(0xbad);
    for splits in [Some(1), Some(4)] {
        let engine = engine(ctx, splits, None);
        let mut c = case::<f32>(
            &mut rng,
            (3, 1, 100, 4, 2, 64),
            DType::F32,
            true,
            Some(16),
            true,
            Layout::Bshd,
        );
        let pages = c.problem.kv_cache.paged.unwrap();
        // Sequence 1 names a page past the pool; sequence 2 claims more keys than seq_kv.
        c.page_table.as_mut().unwrap()[pages.pages_per_seq] = pages.num_pages as u32;
        c.kv_lens = Some(vec![100, 100, 101]);
        let (out, lse) = c.run(ctx, &engine).unwrap();
        let row = 4 * 64; // heads · head_dim per token
        assert!(out[..row].iter().all(|x| x.is_finite()), "sequence 0 is valid");
        assert!(out[row..].iter().all(|x| x.is_nan()), "sequences 1 and 2 are poisoned");
        assert!(lse[..4].iter().all(|x| x.is_finite()) && lse[4..].iter().all(|x| x.is_nan()));
        let host = engine.forward_indexed_blocking(&c.problem, &c.q, &c.k, &c.v, &c.index());
        assert!(matches!(host, Err(Error::InvalidBuffer { .. })), "{host:?}");
    }
    // A paged problem without its index, or an index for a plain problem: errors naming it.
    let engine = FlashAttention::new(ctx);
    let c = case::<f32>(
        &mut rng,
        (2, 1, 50, 4, 2, 64),
        DType::F32,
        false,
        Some(16),
        false,
        Layout::Bshd,
    );
    let err = engine.forward_blocking(&c.problem, &c.q, &c.k, &c.v).unwrap_err();
    assert!(err.to_string().contains("page_table"), "{err}");
    let plain = AttentionProblem::new(shape(2, 1, 50, 4, 2, 64), DType::F32);
    let table = [0u32; 8];
    let index = BatchIndex {
        page_table: Some(&table),
        kv_lens: None,
        ..Default::default()
    };
    let n = |t| plain.required_len(t);
    let x: Vec<f32> = random_tensor(1, n(Tensor::Q).max(n(Tensor::K)));
    let err = engine.forward_indexed_blocking(&plain, &x, &x, &x, &index).unwrap_err();
    assert!(err.to_string().contains("page_table"), "{err}");
}

/// Per-sequence key counts on a prefill-sized problem go to the tiled kernel, which reads them
/// (`_lens`); a paged cache the prefill kernels refuse by name. Forced, the decode kernel runs
/// the counted problem too (64 new tokens are not too many to be right).
#[test]
fn prefill_kernels_read_key_counts_and_refuse_pages() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(5);
    let engine = FlashAttention::new(ctx);
    let c = case::<f32>(
        &mut rng,
        (3, 64, 90, 2, 2, 64),
        DType::F32,
        true,
        None,
        true,
        Layout::Bshd,
    );
    let kernel = c.check(ctx, &engine, "prefill_lens");
    assert!(
        matches!(kernel, ForwardKernel::Tiled(_)) && kernel.name().ends_with("_lens"),
        "{}",
        kernel.name()
    );
    let tiled = FlashAttention::with_options(
        ctx,
        Options {
            choice: KernelChoice::Tiled(Default::default()),
            ..Options::default()
        },
    );
    let paged = case::<f32>(
        &mut rng,
        (1, 64, 64, 2, 2, 64),
        DType::F32,
        false,
        Some(16),
        false,
        Layout::Bshd,
    );
    let err = tiled.select(&paged.problem).unwrap_err();
    assert!(err.to_string().contains("a paged K/V cache"), "{err}");
    let forced = self::engine(ctx, None, None);
    check_any(
        &mut rng,
        ctx,
        &forced,
        (2, 20, 64, 2, 2, 64),
        DType::F32,
        true,
        None,
        true,
        Layout::Bshd,
        "prefill_shape_lens",
    );
}

/// Three serving steps over a paged cache of ragged sequences: each appends one or two new
/// tokens' K/V through the page table (recorded with the attention call in one encoder, by two
/// calls or by `encode_append_and_forward`) and attends over the cache; the pool read back equals
/// the host's copy bit for bit, and the output matches the reference over that copy. A step whose
/// attention cannot run records nothing.
#[test]
fn appending_then_attending_matches_the_reference() {
    use wgpu_flash_attn::batch::AppendBuffers;
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(0xa99e);
    let engine = FlashAttention::new(ctx);
    for (new_tokens, page_size) in [(1, 16), (2, 64)] {
        let (batch, heads, kv_heads, head_dim, max_len) = (3, 8, 2, 64, 200);
        let pages_per_seq = max_len / page_size + 1;
        let pages = PagedKv {
            page_size,
            num_pages: batch * pages_per_seq + 3,
            pages_per_seq,
        };
        let base = AttentionProblem::new(shape(batch, new_tokens, max_len, heads, kv_heads, head_dim), DType::F16)
            .with_causal(true)
            .with_paged_kv(pages, Layout::Bshd)
            .with_kv_lengths(true);
        let mut pool_order: Vec<u32> = (0..pages.num_pages as u32).collect();
        for i in (1..pool_order.len()).rev() {
            pool_order.swap(i, below(&mut rng, i + 1));
        }
        let table = pool_order[..batch * pages_per_seq].to_vec();
        let pool_len = base.required_len(Tensor::K);
        let mut k_pool: Vec<half::f16> = random_tensor(rng.next_u64(), pool_len);
        let mut v_pool: Vec<half::f16> = random_tensor(rng.next_u64(), pool_len);
        let mut lens: Vec<u32> = vec![0, 37, 150];
        let storage = |bytes: &[u8]| storage(ctx, "cache test", bytes);
        let k_buf = storage(bytemuck::cast_slice(&k_pool));
        let v_buf = storage(bytemuck::cast_slice(&v_pool));
        let table_buf = storage(bytemuck::cast_slice(&table));
        for step in 0..3 {
            for l in &mut lens {
                *l += new_tokens as u32;
            }
            let row = kv_heads * head_dim;
            let new_k: Vec<half::f16> = random_tensor(rng.next_u64(), batch * new_tokens * row);
            let new_v: Vec<half::f16> = random_tensor(rng.next_u64(), batch * new_tokens * row);
            for b in 0..batch {
                for t in 0..new_tokens {
                    let key = lens[b] as usize - new_tokens + t;
                    let page = table[b * pages_per_seq + key / page_size] as usize;
                    let at = (page * page_size + key % page_size) * row;
                    let from = (b * new_tokens + t) * row;
                    k_pool[at..at + row].copy_from_slice(&new_k[from..from + row]);
                    v_pool[at..at + row].copy_from_slice(&new_v[from..from + row]);
                }
            }
            let problem = base;
            let q: Vec<half::f16> = random_tensor(rng.next_u64(), problem.required_len(Tensor::Q));
            let (nk, nv, qb, lens_buf) = (
                storage(bytemuck::cast_slice(&new_k)),
                storage(bytemuck::cast_slice(&new_v)),
                storage(bytemuck::cast_slice(&q)),
                storage(bytemuck::cast_slice(&lens)),
            );
            let o = storage(&nan_bytes(DType::F16, problem.required_len(Tensor::O)));
            let lse = storage(&nan_bytes(DType::F32, problem.lse_len()));
            let mut encoder = ctx.device.create_command_encoder(&Default::default());
            let append = AppendBuffers {
                new_k: TensorBuffer::new(&nk),
                new_v: TensorBuffer::new(&nv),
                k_cache: TensorBuffer::new(&k_buf),
                v_cache: TensorBuffer::new(&v_buf),
                page_table: Some(TensorBuffer::new(&table_buf)),
                kv_lens: Some(TensorBuffer::new(&lens_buf)),
            };
            let attend = ForwardBuffers {
                page_table: Some(TensorBuffer::new(&table_buf)),
                kv_lens: Some(TensorBuffer::new(&lens_buf)),
                ..ForwardBuffers::new(
                    TensorBuffer::new(&qb),
                    TensorBuffer::new(&k_buf),
                    TensorBuffer::new(&v_buf),
                    TensorBuffer::new(&o),
                    Some(TensorBuffer::new(&lse)),
                )
            };
            if step == 1 {
                // A step whose attention cannot run (an LSE buffer too small) records nothing,
                // not even the append: NaN rows offered to it never reach the cache.
                let small = storage(&[0u8; 16]);
                let bad = ForwardBuffers {
                    lse: Some(TensorBuffer::new(&small)),
                    ..attend
                };
                let nan_rows = storage(&nan_bytes(DType::F16, new_k.len()));
                let junk = AppendBuffers {
                    new_k: TensorBuffer::new(&nan_rows),
                    new_v: TensorBuffer::new(&nan_rows),
                    ..append
                };
                let mut failed = ctx.device.create_command_encoder(&Default::default());
                let err = engine
                    .encode_append_and_forward(&mut failed, &problem, &junk, &bad, None)
                    .unwrap_err();
                assert!(err.to_string().contains("lse"), "{err}");
                ctx.queue.submit([failed.finish()]);
                let cache =
                    pollster::block_on(read_back(&ctx.device, &ctx.queue, &[(&k_buf, 0, k_buf.size())])).unwrap();
                let cache: Vec<half::f16> = bytemuck::pod_collect_to_vec(&cache[0]);
                assert!(cache.iter().all(|x| x.is_finite()), "the failed step wrote the cache");
            }
            // The serving step: recorded by the two calls on even steps, by the one on odd ones.
            if step % 2 == 0 {
                engine.encode_append_kv(&mut encoder, &problem, &append).unwrap();
                engine.encode_forward(&mut encoder, &problem, &attend, None).unwrap();
            } else {
                engine
                    .encode_append_and_forward(&mut encoder, &problem, &append, &attend, None)
                    .unwrap();
            }
            ctx.queue.submit([encoder.finish()]);
            let bytes = pollster::block_on(read_back(
                &ctx.device,
                &ctx.queue,
                &[
                    (&k_buf, 0, k_buf.size()),
                    (&v_buf, 0, v_buf.size()),
                    (&o, 0, o.size()),
                    (&lse, 0, lse.size()),
                ],
            ))
            .unwrap();
            let label = format!("step{step}_new{new_tokens}_page{page_size}");
            assert!(bytes[0] == bytemuck::cast_slice::<_, u8>(&k_pool), "{label}: K pool");
            assert!(bytes[1] == bytemuck::cast_slice::<_, u8>(&v_pool), "{label}: V pool");
            let out: Vec<half::f16> = bytemuck::pod_collect_to_vec(&bytes[2]);
            let lse_out: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes[3]);
            let index = BatchIndex {
                page_table: Some(&table),
                kv_lens: Some(&lens),
                ..Default::default()
            };
            let want = reference::attention_indexed(&problem, &q, &k_pool, &v_pool, &index).unwrap();
            let o_err = ErrorStats::from_pairs(out.iter().map(|x| x.to_f64()).zip(want.out.iter().copied()));
            let l_err = ErrorStats::from_pairs(lse_out.iter().map(|&x| x as f64).zip(want.lse.iter().copied()));
            let tol = tolerance(DType::F16);
            assert!(o_err.within(tol.out_rel_l2, tol.out_max_abs), "{label}: O {o_err}");
            assert!(l_err.within(1e-5, tol.lse_max_abs), "{label}: LSE {l_err}");
        }
    }
}

/// Page-table entries past a sequence's key count are never read: a serving loop leaves them
/// unset (here: past the pool), and the output is bit for bit that of the same cache with them
/// valid. Pieces of the keys past a short sequence's end are empty; before, they walked the
/// masked keys between the sequence's end and their own start, and met those entries.
#[test]
fn entries_past_a_sequence_are_never_read() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(0x7a11);
    for splits in [Some(1), Some(4), Some(7), None] {
        let engine = engine(ctx, splits, None);
        let mut c = case::<f32>(
            &mut rng,
            (2, 1, 100, 4, 2, 64),
            DType::F32,
            true,
            Some(16),
            true,
            Layout::Bshd,
        );
        c.kv_lens = Some(vec![20, 100]);
        c.check(ctx, &engine, &format!("short_sequence_{splits:?}"));
        let (want, want_lse) = c.run(ctx, &engine).unwrap();
        let pages = c.problem.kv_cache.paged.unwrap();
        // Sequence 0's 20 keys lie in its first two pages; the rest of its entries name no page.
        for entry in &mut c.page_table.as_mut().unwrap()[2..pages.pages_per_seq] {
            *entry = pages.num_pages as u32;
        }
        let (out, lse) = c.run(ctx, &engine).unwrap();
        assert!(
            out.iter().all(|x| x.is_finite()),
            "{splits:?}: an entry past the sequence was read"
        );
        assert_eq!(out, want, "{splits:?}");
        assert_eq!(lse, want_lse, "{splits:?}");
    }
}

/// A caller's byte offset 8 bytes off a 16-byte boundary, on a K that selection found aligned for
/// 16-byte loads: the lane kernel loads it granule by granule instead, and stays right.
#[test]
fn a_k_off_16_bytes_is_loaded_granule_by_granule() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(0x0ff16);
    let engine = engine(ctx, None, None);
    for page_size in [None, Some(16)] {
        let mut c = case::<half::f16>(
            &mut rng,
            (2, 2, 300, 8, 2, 64),
            DType::F16,
            true,
            page_size,
            false,
            Layout::Bshd,
        );
        c.k_byte_offset = 8;
        let selected = engine.select(&c.problem).unwrap().name();
        assert!(selected.contains("_w16"), "{selected}");
        c.check(ctx, &engine, &format!("k_off_16_{page_size:?}"));
    }
}

/// Values the rows may not see stay out of their outputs: the cache's first row holds +∞ in V (the
/// row that keys past a piece are loaded from, their values zeroed where used) and every row past
/// a sequence's length holds NaN in K and V (a cache that is not cleared). Sequence 0 sees the
/// first row, so only the other sequences' rows are compared; pieces cut anywhere (forced splits),
/// lengths ragged (0, 1, all, random), both lane reductions.
#[test]
fn values_past_a_sequence_or_piece_never_reach_its_rows() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(0x1f1e);
    let reductions: Vec<Option<Reduction>> = if ctx.caps.subgroups {
        vec![Some(Reduction::Subgroup), Some(Reduction::Workgroup)]
    } else {
        vec![Some(Reduction::Workgroup)]
    };
    let (batch, seq_q, seq_kv, heads, kv_heads, head_dim) = (4, 3, 203, 8, 2, 64);
    let mut c = case::<f32>(
        &mut rng,
        (batch, seq_q, seq_kv, heads, kv_heads, head_dim),
        DType::F32,
        true,
        None,
        true,
        Layout::Bshd,
    );
    let row = kv_heads * head_dim;
    c.v[..row].fill(f32::INFINITY);
    let lens = c.kv_lens.clone().unwrap();
    for (b, &len) in lens.iter().enumerate() {
        let tail = (b * seq_kv + len as usize) * row..(b + 1) * seq_kv * row;
        c.k[tail.clone()].fill(f32::NAN);
        c.v[tail].fill(f32::NAN);
    }
    let want = reference::attention_indexed(&c.problem, &c.q, &c.k, &c.v, &c.index()).unwrap();
    let (o_rows, lse_rows) = (seq_q * heads * head_dim, heads * seq_q);
    for splits in [None, Some(1), Some(3), Some(7)] {
        for &reduction in &reductions {
            let engine = engine(ctx, splits, reduction);
            let (out, lse) = c.run(ctx, &engine).unwrap();
            let o = ErrorStats::from_pairs(
                out[o_rows..]
                    .iter()
                    .map(|&x| x as f64)
                    .zip(want.out[o_rows..].iter().copied()),
            );
            let l = ErrorStats::from_pairs(
                lse[lse_rows..]
                    .iter()
                    .map(|&x| x as f64)
                    .zip(want.lse[lse_rows..].iter().copied()),
            );
            let tol = tolerance(DType::F32);
            assert!(
                o.within(tol.out_rel_l2, tol.out_max_abs),
                "{splits:?} {reduction:?}: O {o}"
            );
            assert!(l.within(1e-5, tol.lse_max_abs), "{splits:?} {reduction:?}: LSE {l}");
        }
    }
}
