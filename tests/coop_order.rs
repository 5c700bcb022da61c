//! The cooperative-matrix kernel's workgroup order (`tile_of_workgroup` in shaders/flash_fwd_coop.wgsl), run
//! as written on whatever device the tests have: the function needs no matrices, so lavapipe runs
//! it in CI while the kernel around it only runs where cooperative matrices exist. Under a causal
//! mask it renumbers the grid in groups of heads; every (query tile, head, batch) must still be
//! computed exactly once, longest first within each group, for grids whose last group is partial
//! too.

mod common;

use wgpu::util::DeviceExt;
use wgpu_flash_attn::wgsl::FLASH_FWD_COOP;

/// The kernel's order constant and function, cut from its source: from the constant's
/// declaration to the function's closing brace.
fn order_source() -> &'static str {
    wgpu_flash_attn::testing::shader::wgsl_through_fn(
        FLASH_FWD_COOP,
        "const CAUSAL_GROUP_WORKGROUPS",
        "tile_of_workgroup",
    )
    .expect("flash_fwd_coop.wgsl declares CAUSAL_GROUP_WORKGROUPS, then tile_of_workgroup")
}

/// A module around the kernel's function for query tiles of `block_m` rows: it writes, for each
/// workgroup of the grid (by linear index, launched x first), the tile it computes.
fn order_module(block_m: u32) -> String {
    // The function reads BLOCK_M and params.causal only.
    format!(
        "const BLOCK_M: u32 = {block_m}u;\n\
         struct Params {{ causal: u32, pad0: u32, pad1: u32, pad2: u32 }}\n\
         @group(0) @binding(0) var<uniform> params: Params;\n\
         @group(0) @binding(1) var<storage, read_write> tiles: array<vec4<u32>>;\n\
         {}\n\
         @compute @workgroup_size(1)\n\
         fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {{\n\
             tiles[wg.x + groups.x * (wg.y + groups.y * wg.z)] = vec4<u32>(tile_of_workgroup(wg, groups), 1u);\n\
         }}\n",
        order_source()
    )
}

/// The kernel's group size in workgroups for `block_m`-row tiles (0: no grouping), as naga
/// evaluates the module's constant, so that the test follows a retuned value.
fn group_workgroups(block_m: u32) -> u32 {
    let module = naga::front::wgsl::parse_str(&order_module(block_m)).expect("the order module parses");
    wgpu_flash_attn::testing::shader::wgsl_u32_constant(&module, "CAUSAL_GROUP_WORKGROUPS")
        .expect("CAUSAL_GROUP_WORKGROUPS is a u32 constant")
}

/// Where each workgroup of a `groups` grid goes, for query tiles of `block_m` rows.
fn mapped_tiles(groups: [u32; 3], block_m: u32, causal: bool) -> Option<Vec<[u32; 3]>> {
    let ctx = common::gpu()?;
    let source = order_module(block_m);
    let device = &ctx.device;
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("order"),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("order"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let count = (groups[0] * groups[1] * groups[2]) as usize;
    let params = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("order params"),
        contents: bytemuck::cast_slice(&[causal as u32, 0, 0, 0]),
        usage: wgpu::BufferUsages::UNIFORM,
    });
    let size = (count * 16) as u64;
    let tiles = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("order tiles"),
        size,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("order"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: params.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: tiles.as_entire_binding(),
            },
        ],
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
    }
    ctx.queue.submit([encoder.finish()]);
    let bytes = pollster::block_on(wgpu_flash_attn::testing::shader::read_back(
        device,
        &ctx.queue,
        &[(&tiles, 0, size)],
    ))
    .expect("read the tiles back");
    let words: Vec<u32> = bytemuck::cast_slice(&bytes[0]).to_vec();
    Some(
        words
            .chunks(4)
            .map(|w| {
                assert_eq!(w[3], 1, "a workgroup of {groups:?} wrote nothing");
                [w[0], w[1], w[2]]
            })
            .collect(),
    )
}

#[test]
fn causal_order_computes_every_tile_once_longest_first_within_groups() {
    // (query tiles, heads, batch). With groups of 512 workgroups (512 / query tiles heads each):
    // whole groups (64 tiles: 8 heads, 16 × 2 = 4 groups; 8 tiles: 64 heads, 256 in 4 groups),
    // a partial last group (64 × 7 × 3: 8, 8, 5 heads), tile counts that do not divide 512, with
    // whole and partial groups (100: 5 heads, of 32; 48: 10 heads, of 13; 7: 73 heads, of 100;
    // 255: 2 heads, of 10), one group holding every head (5 × 3 × 7, 3 × 5 × 1), one head per
    // group, which is grid order (512 and 600 tiles), and a single workgroup.
    let grids = [
        [64, 16, 2],
        [8, 16, 16],
        [64, 7, 3],
        [100, 16, 2],
        [48, 13, 1],
        [7, 100, 1],
        [255, 5, 2],
        [5, 3, 7],
        [3, 5, 1],
        [512, 2, 1],
        [600, 3, 1],
        [1, 1, 1],
    ];
    for groups in grids {
        for (block_m, causal) in [(128, true), (128, false), (64, true)] {
            let Some(tiles) = mapped_tiles(groups, block_m, causal) else {
                return;
            };
            let label = format!("{groups:?}, {block_m}-row tiles, causal {causal}");
            // Exactly once each.
            let mut seen = vec![false; tiles.len()];
            for t in &tiles {
                assert!(
                    t[0] < groups[0] && t[1] < groups[1] && t[2] < groups[2],
                    "{label}: {t:?} outside the grid"
                );
                let i = (t[0] + groups[0] * (t[1] + groups[1] * t[2])) as usize;
                assert!(!seen[i], "{label}: {t:?} twice");
                seen[i] = true;
            }
            let heads_in_group = if causal {
                group_workgroups(block_m) / groups[0]
            } else {
                1
            };
            if heads_in_group <= 1 {
                // Grid order.
                for (i, t) in tiles.iter().enumerate() {
                    let want = [
                        i as u32 % groups[0],
                        i as u32 / groups[0] % groups[1],
                        i as u32 / (groups[0] * groups[1]),
                    ];
                    assert_eq!(*t, want, "{label}: workgroup {i} not in grid order");
                }
                continue;
            }
            // Within a group (heads_in_group heads of every query tile), ranks never decrease,
            // and every workgroup of a group is of that group's heads.
            let per_group = (heads_in_group * groups[0]) as usize;
            for (g, chunk) in tiles.chunks(per_group).enumerate() {
                let first_head = g as u32 * heads_in_group;
                for pair in chunk.windows(2) {
                    assert!(
                        pair[0][0] <= pair[1][0],
                        "{label}: rank falls within group {g}: {pair:?}"
                    );
                }
                for t in chunk {
                    let head_batch = t[1] + groups[1] * t[2];
                    assert!(
                        (first_head..first_head + heads_in_group).contains(&head_batch),
                        "{label}: {t:?} in group {g}"
                    );
                }
            }
        }
    }
}
