// coop_registers.wgsl — the cooperative-matrix kernel's online softmax on the accumulator's own registers,
// for devices whose fragment layout allows it (src/caps/register_layout.rs; REGISTER_SOFTMAX).
//
// What an invocation owns: the COOP_COMPONENTS components it holds of each 16 × 16 score
// fragment. They fall into ROW_SLOTS rows (COMPONENT_SLOT_BITS: the slot of component i in bits
// 2i..2i+2, the same for every invocation); the invocations that hold a row are one XOR coset of
// lanes, so a row's max and sum are ROW_LANE_MASK_COUNT shuffles (masks in ROW_LANE_MASK_BITS,
// five bits each). Which row and column each component is, the kernel measures once at its start
// (rows_in_registers), the same way the host's probe did: the layout constants are the host's,
// the lane-dependent positions the pipeline's own.
//
// Why: the scores never leave registers. The workgroup-memory softmax stores every score
// fragment, reads it back by rows, writes P and loads it as the next product's operand; here P is
// computed component by component where the scores are and becomes the A operand directly, which
// the probe checked is laid out like the accumulator. Row factors and 1/l are built the same way.
//
// The element access is SPIR-V's: coop_elements.wgsl.

// Column bits: 4 per component, 8 components per word.
const COL_WORDS: u32 = (COOP_COMPONENTS + 7u) / 8u;

// Dropout's generator (dropout.wgsl) decides blocks of 2 rows × 4 keys, so a 16 × 16 score block
// holds 32 of them (8 row pairs × 4 key quads, numbered 4·pair + quad), whose 128 words decide two
// elements each. Each invocation draws DROPOUT_DRAWS of those blocks, all of them stage their
// words in the subgroup's score window (free while the scores stay in registers), and each reads
// back the word of each of its components (kept_components): one draw per block. Drawing the
// blocks of its own components instead, every invocation would draw one for each pair of them,
// four times as many on the H200's layout, where each block's four words go to four invocations.
const DROPOUT_DRAWS: u32 = 32u / SUBGROUP;
// Where each component's word is staged: 8 bits a component (block 5, word 2, half 1), 4 a u32.
const DROPOUT_AT_WORDS: u32 = COOP_COMPONENTS / 4u;
const_assert COOP_COMPONENTS % 4u == 0u;

// One invocation's rows: per slot its query row's visible keys [kv_begin, kv_end), reference
// max, partial sum (over this invocation's components) and last rescale factor; its components'
// columns; and for dropout, where its subgroup's rows start, its lane and score window, and
// where each component's word is staged.
struct RegisterRows {
    kv_begin: array<u32, ROW_SLOTS>,
    kv_end: array<u32, ROW_SLOTS>,
    row: array<u32, ROW_SLOTS>,
    m_used: array<f32, ROW_SLOTS>,
    m_raw: array<f32, ROW_SLOTS>,
    l_part: array<f32, ROW_SLOTS>,
    alpha: array<f32, ROW_SLOTS>,
    cols: array<u32, COL_WORDS>,
    huge_seen: bool, // some slot's reference was huge at some tile (is_huge_reference)
    first_row: u32,
    lane: u32,
    window: u32,
    dropout_at: array<u32, DROPOUT_AT_WORDS>,
}

// Finds where this invocation's components lie by loading a fragment whose element (r, c) is
// 16·r + c from the subgroup's 16 × 16 window of `scores` at `window` (vec4s, S_STRIDE a row), for
// the query tile's rows starting at `first_row`.
fn rows_in_registers(seq: Sequence, window: u32, lane: u32, first_row: u32) -> RegisterRows {
    for (var e = lane; e < 256u; e += SUBGROUP) {
        scores[window + (e / 16u) * S_STRIDE + (e % 16u) / 4u][e % 4u] = f32(e);
    }
    subgroupBarrier();
    let index = coop_elements_c(coopLoadT<coop_mat16x16<f32, C>>(&scores[window], S_STRIDE));
    subgroupBarrier(); // read before anything else uses the window
    var rows: RegisterRows;
    rows.first_row = first_row;
    rows.lane = lane;
    rows.window = window;
    // @unroll
    for (var i = 0u; i < COOP_COMPONENTS; i++) {
        let e = u32(index[i]);
        let r = e / 16u;
        let c = e % 16u;
        rows.row[(COMPONENT_SLOT_BITS >> (2u * i)) & 3u] = first_row + r;
        rows.cols[i / 8u] |= c << (4u * (i % 8u));
        // first_row is even, so r's parity is the row's.
        let at = (4u * (r / 2u) + c / 4u) << 3u | (2u * (r % 2u) + (c % 4u) / 2u) << 1u | (c % 2u);
        rows.dropout_at[i / 4u] |= at << (8u * (i % 4u));
    }
    // @unroll
    for (var s = 0u; s < ROW_SLOTS; s++) {
        let keys = visible_keys(seq, rows.row[s]);
        rows.kv_begin[s] = keys.x;
        rows.kv_end[s] = keys.y;
    }
    restart_rows(&rows);
    return rows;
}

// The rows' softmax state before their first K/V tile.
fn restart_rows(rows: ptr<function, RegisterRows>) {
    // @unroll
    for (var s = 0u; s < ROW_SLOTS; s++) {
        (*rows).m_used[s] = neg_inf();
        (*rows).m_raw[s] = neg_inf();
        (*rows).l_part[s] = 0.0;
        (*rows).alpha[s] = 1.0;
    }
    (*rows).huge_seen = false;
}

// The key column of component i of score block j of the K/V tile at key n0.
fn component_col(rows: ptr<function, RegisterRows>, n0: u32, j: u32, i: u32) -> u32 {
    return n0 + 16u * j + (((*rows).cols[i / 8u] >> (4u * (i % 8u))) & 15u);
}

// x reduced over the invocations that share its row.
fn row_max(x: f32) -> f32 {
    var r = x;
    // @unroll
    for (var b = 0u; b < ROW_LANE_MASK_COUNT; b++) {
        r = max(r, subgroupShuffleXor(r, (ROW_LANE_MASK_BITS >> (5u * b)) & 31u));
    }
    return r;
}

fn row_sum(x: f32) -> f32 {
    var r = x;
    // @unroll
    for (var b = 0u; b < ROW_LANE_MASK_COUNT; b++) {
        r += subgroupShuffleXor(r, (ROW_LANE_MASK_BITS >> (5u * b)) & 31u);
    }
    return r;
}

// The bias tensor's terms (bias_raw) of this invocation's components of the K/V tile at key n0.
// A block inside the bias comes in one cooperative load where the host compiled that in
// (score_bias_fragments_bound.wgsl); the blocks at the sequence's edges, and every block without
// it, element by element. The branch is uniform over the subgroup, as the load needs.
fn bias_components(rows: ptr<function, RegisterRows>, seq: Sequence, head: u32, n0: u32, terms: ScoreTerms) -> array<array<f32, COOP_COMPONENTS>, N_BLOCKS> {
    var b: array<array<f32, COOP_COMPONENTS>, N_BLOCKS>;
    // @unroll
    for (var j = 0u; j < N_BLOCKS; j++) {
        let col = n0 + 16u * j;
        if (BIAS_FRAGMENTS && bias_block_inside(seq, (*rows).first_row, col)) {
            let raw = coop_elements_a(bias_fragment(seq, head, (*rows).first_row, col));
            // −∞ (a hidden key) stays −∞, as bias_raw makes it.
            let raw_per_bias = LOG2_E * terms.raw_per_base2;
            // @unroll
            for (var i = 0u; i < COOP_COMPONENTS; i++) {
                b[j][i] = f32(raw[i]) * raw_per_bias;
            }
        } else {
            // @unroll
            for (var i = 0u; i < COOP_COMPONENTS; i++) {
                let slot = (COMPONENT_SLOT_BITS >> (2u * i)) & 3u;
                b[j][i] = bias_raw(seq, head, (*rows).row[slot], component_col(rows, n0, j, i), terms);
            }
        }
    }
    return b;
}

// Which of this invocation's components of the K/V tile at key n0 the mask tensor hides: bit i of
// word j for component i of score block j.
fn hidden_components(rows: ptr<function, RegisterRows>, seq: Sequence, head: u32, n0: u32) -> array<u32, N_BLOCKS> {
    var hidden = array<u32, N_BLOCKS>();
    // @unroll
    for (var j = 0u; j < N_BLOCKS; j++) {
        // @unroll
        for (var i = 0u; i < COOP_COMPONENTS; i++) {
            let slot = (COMPONENT_SLOT_BITS >> (2u * i)) & 3u;
            if (mask_hides(seq, head, (*rows).row[slot], component_col(rows, n0, j, i))) {
                hidden[j] |= 1u << i;
            }
        }
    }
    return hidden;
}

// The 16-bit draw staged at `at`'s low 8 bits (rows_in_registers) in the score window at `window`.
fn staged_draw(window: u32, at: u32) -> u32 {
    let word = bitcast<u32>(scores[window + ((at >> 3u) & 31u)][(at >> 1u) & 3u]);
    return (word >> (16u * (at & 1u))) & 0xffffu;
}

// Which of this invocation's components of score block j of the K/V tile at key n0 dropout keeps
// (dropout.wgsl): bit i for component i. The subgroup's invocations draw the block's generator
// blocks between them and exchange the words through the score window (DROPOUT_DRAWS); called
// by the whole subgroup.
fn kept_components(rows: ptr<function, RegisterRows>, seq: Sequence, head: u32, n0: u32, j: u32) -> u32 {
    let window = (*rows).window;
    subgroupBarrier(); // the previous exchange is read
    // @unroll
    for (var d = 0u; d < DROPOUT_DRAWS; d++) {
        let block = (*rows).lane + SUBGROUP * d;
        let words = dropout_words(seq.b, head, (*rows).first_row + 2u * (block / 4u), n0 + 16u * j + 4u * (block % 4u));
        scores[window + block] = bitcast<vec4<f32>>(words);
    }
    subgroupBarrier(); // the words visible to the subgroup
    var kept = 0u;
    // @unroll
    for (var g = 0u; g < DROPOUT_AT_WORDS; g++) {
        let at = (*rows).dropout_at[g];
        let draws = vec4<u32>(staged_draw(window, at), staged_draw(window, at >> 8u), staged_draw(window, at >> 16u), staged_draw(window, at >> 24u));
        let keeps = select(vec4<u32>(0u), vec4<u32>(1u, 2u, 4u, 8u), draws_keep(draws));
        kept |= (keeps.x | keeps.y | keeps.z | keeps.w) << (4u * g);
    }
    return kept;
}

// The online softmax of one K/V tile, at key n0 (of sequence `seq`, head `head`, whose score terms
// are `terms`, with `bias` from bias_components when there is a bias tensor and `hidden` from
// hidden_components where the tile reads the mask, else 0): the score fragments `s` become
// P = exp2(scale·s − m_used) in place (f32, still accumulator fragments; a huge reference's form
// in the exact pass, `exact`, attend_kv_tiles), 0 where dropout drops the element after the row
// sums took it; m_used, l_part and alpha move as in the workgroup-memory softmax
// (flash_fwd_coop.wgsl: next_reference_max, rescale_factor). Returns whether some row of the
// subgroup moved (subgroup-uniform; the shipped kernel rescales every tile and ignores it, the
// cost probes in examples/coop_diagnostics.rs branch on it).
fn softmax_in_registers(rows: ptr<function, RegisterRows>, s: ptr<function, array<coop_mat16x16<f32, C>, N_BLOCKS>>, n0: u32, needs_mask: bool, seq: Sequence, head: u32, terms: ScoreTerms, bias: array<array<f32, COOP_COMPONENTS>, N_BLOCKS>, hidden: array<u32, N_BLOCKS>, exact: bool) -> bool {
    var x: array<array<f32, COOP_COMPONENTS>, N_BLOCKS>;
    var raw_max: array<f32, ROW_SLOTS>;
    // @unroll
    for (var sl = 0u; sl < ROW_SLOTS; sl++) {
        raw_max[sl] = hidden_score();
    }
    // @unroll
    for (var j = 0u; j < N_BLOCKS; j++) {
        x[j] = coop_elements_c((*s)[j]);
    }
    // With CAP_DENOMINATORS the scores become tanh's denominators, which order as the capped
    // scores do (flash_fwd_coop.wgsl, cap_denominator): the masks and maxima below take them
    // as they are.
    if (SOFTCAP) {
        // @unroll
        for (var j = 0u; j < N_BLOCKS; j++) {
            // @unroll
            for (var i = 0u; i < COOP_COMPONENTS; i++) {
                if (CAP_DENOMINATORS) {
                    x[j][i] = cap_denominator(x[j][i]);
                } else {
                    x[j][i] = soft_cap_raw(x[j][i]);
                }
            }
        }
    }
    if (has_score_terms()) {
        // @unroll
        for (var j = 0u; j < N_BLOCKS; j++) {
            // @unroll
            for (var i = 0u; i < COOP_COMPONENTS; i++) {
                let slot = (COMPONENT_SLOT_BITS >> (2u * i)) & 3u;
                if (ALIBI) {
                    x[j][i] += alibi_raw(seq, (*rows).row[slot], component_col(rows, n0, j, i), terms);
                }
                if (HAS_BIAS) {
                    x[j][i] += bias[j][i];
                }
            }
        }
    }
    // The bounds and window mask is a block of its own under one branch: folded into the loop of
    // the running max below, NVIDIA's compiler predicated its comparisons into every tile, the
    // tiles that need no mask (nearly all) included.
    if (needs_mask) {
        // @unroll
        for (var j = 0u; j < N_BLOCKS; j++) {
            // @unroll
            for (var i = 0u; i < COOP_COMPONENTS; i++) {
                let slot = (COMPONENT_SLOT_BITS >> (2u * i)) & 3u;
                let col = component_col(rows, n0, j, i);
                let outside = (col < (*rows).kv_begin[slot]) | (col >= (*rows).kv_end[slot]);
                x[j][i] = select(x[j][i], hidden_score(), outside);
            }
        }
    }
    // @unroll
    for (var j = 0u; j < N_BLOCKS; j++) {
        // @unroll
        for (var i = 0u; i < COOP_COMPONENTS; i++) {
            let slot = (COMPONENT_SLOT_BITS >> (2u * i)) & 3u;
            if (HAS_MASK) {
                x[j][i] = select(x[j][i], hidden_score(), ((hidden[j] >> i) & 1u) != 0u);
            }
            raw_max[slot] = max(raw_max[slot], x[j][i]);
        }
    }
    var moved = false;
    // exp2's argument is x·scale − m_exp, one fused multiply-add from the raw score; in the exact
    // pass (`exact`, attend_kv_tiles) rows with a huge reference (is_huge_reference) subtract
    // their raw max first, (x − shift)·scale with shift = m_raw and m_exp = 0, exact at the max.
    // The fast pass only notes them. With CAP_DENOMINATORS, x is tanh's denominator d and the
    // argument the capped scaled score less m_exp, cap · (1 − 2/d) − m_exp (cap = params.softcap,
    // the cap in exp2's units): one multiply-add from 1/d.
    var shift: array<f32, ROW_SLOTS>; // set in full below, before any read
    var m_exp: array<f32, ROW_SLOTS>; // set in full below, before any read
    // @unroll
    for (var sl = 0u; sl < ROW_SLOTS; sl++) {
        let m_used = (*rows).m_used[sl];
        var tile_raw_max = row_max(raw_max[sl]);
        var tile_max = tile_raw_max * params.scale;
        if (CAP_DENOMINATORS) {
            tile_max = capped_from_denominator(tile_raw_max);
            // m_raw's units; only the exact pass reads it, which these rows never take.
            tile_raw_max = tile_max / params.scale;
        }
        let m_new = next_reference_max(m_used, tile_max);
        let alpha = rescale_factor(m_used, m_new);
        (*rows).alpha[sl] = alpha;
        (*rows).m_raw[sl] = next_reference_raw((*rows).m_raw[sl], tile_raw_max, alpha);
        (*rows).m_used[sl] = m_new;
        (*rows).l_part[sl] *= alpha;
        let huge = is_huge_reference(m_new);
        (*rows).huge_seen = (*rows).huge_seen | huge;
        shift[sl] = select(0.0, (*rows).m_raw[sl], huge);
        m_exp[sl] = select(exp_reference(m_new), 0.0, exact & huge);
        moved = moved || alpha != 1.0;
    }
    // @unroll
    for (var j = 0u; j < N_BLOCKS; j++) {
        var kept = 0xffffffffu;
        if (DROPOUT) {
            kept = kept_components(rows, seq, head, n0, j);
        }
        // @unroll
        for (var i = 0u; i < COOP_COMPONENTS; i++) {
            let slot = (COMPONENT_SLOT_BITS >> (2u * i)) & 3u;
            var arg = x[j][i] * params.scale - m_exp[slot];
            if (CAP_DENOMINATORS) {
                arg = fma(-2.0 * params.softcap, 1.0 / x[j][i], params.softcap - m_exp[slot]);
            } else if (exact) {
                arg = (x[j][i] - shift[slot]) * params.scale - m_exp[slot];
            }
            let p = exp2(arg);
            (*rows).l_part[slot] += p;
            x[j][i] = select(0.0, p, ((kept >> i) & 1u) != 0u);
        }
        (*s)[j] = coop_from_elements_c(x[j]);
    }
    return subgroupAny(moved);
}

// Block j of P as the next product's A operand.
fn probs_operand(p: coop_mat16x16<f32, C>) -> coop_mat16x16<f16, A> {
    let x = coop_elements_c(p);
    var h: array<f16, COOP_COMPONENTS>;
    // @unroll
    for (var i = 0u; i < COOP_COMPONENTS; i++) {
        h[i] = f16(x[i]);
    }
    return coop_from_elements_a(h);
}

// An accumulator fragment whose every row holds that row's value of `per_slot`.
fn row_matrix(per_slot: array<f32, ROW_SLOTS>) -> coop_mat16x16<f32, C> {
    var f: array<f32, COOP_COMPONENTS>;
    // @unroll
    for (var i = 0u; i < COOP_COMPONENTS; i++) {
        f[i] = per_slot[(COMPONENT_SLOT_BITS >> (2u * i)) & 3u];
    }
    return coop_from_elements_c(f);
}
