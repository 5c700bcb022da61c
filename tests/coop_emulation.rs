//! The emulated cooperative matrices (src/wgsl/coop_emulation.rs) against the host: loads in both
//! majors at a stride, products, stores, element access. Runs where the test device emulates them
//! (`LP_NATIVE_VECTOR_WIDTH=512 FLASH_EMULATE_MATRICES=1` on lavapipe; scripts/test.sh); skips
//! elsewhere.

mod common;

use common::gpu;
use half::f16;
use wgpu::util::DeviceExt;
use wgpu_flash_attn::testing::Rng;
use wgpu_flash_attn::wgsl::coop_emulation::emulate_cooperative_matrices;

/// D = A·B + C for 16 × 16 matrices, A row-major, B column-major (as the kernels load Kᵀ) and C
/// row-major, each 16 × 16 inside rows of `stride` vec4s; D stored row-major and column-major.
/// Then every invocation's components of D, through the element access, times 2 and back.
const MODULE: &str = "enable f16;
enable wgpu_cooperative_matrix;
const COOP_COMPONENTS: u32 = NCOMPu;
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f16>>;
@group(0) @binding(1) var<storage, read> b_in: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read> c_in: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> d_out: array<vec4<f32>>;
var<workgroup> staged: array<vec4<f32>, 256>;

fn coop_elements_c(m: coop_mat16x16<f32, C>) -> array<f32, COOP_COMPONENTS> {
    return array<f32, COOP_COMPONENTS>();
}

fn coop_from_elements_c(x: array<f32, COOP_COMPONENTS>) -> coop_mat16x16<f32, C> {
    return coop_mat16x16<f32, C>();
}

@compute @workgroup_size(LANES)
fn main(@builtin(local_invocation_index) li: u32) {
    let a = coopLoadT<coop_mat16x16<f16, A>>(&a_in[STRIDE], STRIDE);
    let b = coopLoad<coop_mat16x16<f16, B>>(&b_in[1u], STRIDE);
    let c = coopLoadT<coop_mat16x16<f32, C>>(&c_in[0], STRIDE);
    let d = coopMultiplyAdd(a, b, c);
    coopStoreT(d, &staged[0], 4u);
    workgroupBarrier();
    for (var e = li; e < 64u; e += LANESu) {
        d_out[e] = staged[e];
    }
    coopStore(d, &d_out[64u], 4u);
    var x = coop_elements_c(d);
    for (var i = 0u; i < COOP_COMPONENTS; i++) {
        x[i] *= 2.0;
    }
    coopStoreT(coop_from_elements_c(x), &d_out[128u], 4u);
}
";

#[test]
fn emulated_matrices_multiply_load_and_store_like_matrices() {
    let Some(ctx) = gpu() else { return };
    if !ctx.caps.cooperative_matrix_emulated {
        eprintln!("skipped: {} does not emulate cooperative matrices", ctx.info.name);
        return;
    }
    let stride = 5usize; // vec4s per row: 16 elements and 4 of padding
    let mut rng = Rng::new(0xe307);
    let mut values = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.normal() as f32).collect() };
    let (a, b, c) = (values(16 * 16), values(16 * 16), values(16 * 16));
    let a: Vec<f16> = a.iter().map(|&x| f16::from_f32(x)).collect();
    let b: Vec<f16> = b.iter().map(|&x| f16::from_f32(x)).collect();
    // A row-major from vec4 `stride`, B column-major from vec4 1, C row-major from 0.
    let mut a_in = vec![f16::from_f32(f32::NAN); 4 * stride * 17];
    let mut b_in = vec![f16::from_f32(f32::NAN); 4 * (1 + stride * 16)];
    let mut c_in = vec![f32::NAN; 4 * stride * 16];
    for r in 0..16 {
        for col in 0..16 {
            a_in[4 * stride + 4 * stride * r + col] = a[16 * r + col];
            b_in[4 + 4 * stride * col + r] = b[16 * r + col];
            c_in[4 * stride * r + col] = c[16 * r + col];
        }
    }
    let lanes = ctx.caps.subgroup_max_size;
    let module = MODULE
        .replace("STRIDE", &format!("{stride}u"))
        .replace("LANES", &lanes.to_string())
        .replace("NCOMP", &(256 / lanes).to_string());
    let source = emulate_cooperative_matrices(&module, lanes).unwrap();
    let buffer = |contents: &[u8], usage| {
        ctx.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents,
            usage,
        })
    };
    let storage = wgpu::BufferUsages::STORAGE;
    let inputs = [
        buffer(bytemuck::cast_slice(&a_in), storage),
        buffer(bytemuck::cast_slice(&b_in), storage),
        buffer(bytemuck::cast_slice(&c_in), storage),
    ];
    let out = buffer(
        bytemuck::cast_slice(&vec![f32::NAN; 3 * 256]),
        storage | wgpu::BufferUsages::COPY_SRC,
    );
    let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let shader = ctx.device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: None,
        source: wgpu::ShaderSource::Wgsl(source.into()),
    });
    let pipeline = ctx.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: None,
        module: &shader,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        panic!("the emulated module: {e}");
    }
    let entries: Vec<wgpu::BindGroupEntry> = inputs
        .iter()
        .chain([&out])
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: b.as_entire_binding(),
        })
        .collect();
    let group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &entries,
    });
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(1, 1, 1);
    }
    ctx.queue.submit([encoder.finish()]);
    let got: Vec<f32> = pollster::block_on(wgpu_flash_attn::gpu::readback::read_back(
        &ctx.device,
        &ctx.queue,
        &[(&out, 0, out.size())],
    ))
    .unwrap()
    .remove(0)
    .chunks_exact(4)
    .map(|w| f32::from_le_bytes(w.try_into().unwrap()))
    .collect();
    for r in 0..16 {
        for col in 0..16 {
            let want: f64 = (0..16)
                .map(|k| a[16 * r + k].to_f64() * b[16 * k + col].to_f64())
                .sum::<f64>()
                + c[16 * r + col] as f64;
            let row_major = got[16 * r + col] as f64;
            let col_major = got[256 + 16 * col + r] as f64;
            let doubled = got[512 + 16 * r + col] as f64;
            assert!(
                (row_major - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "D[{r}][{col}] = {row_major}, want {want}"
            );
            assert_eq!(col_major, row_major, "column-major D[{r}][{col}]");
            assert_eq!(doubled, 2.0 * row_major, "element access of D[{r}][{col}]");
        }
    }
}
