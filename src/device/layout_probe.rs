//! Measures a device's cooperative-matrix fragment layout ([`RegisterLayout`]) when a context is
//! created: a 32-invocation probe loads matrices whose element (r, c) holds 16·r + c and reads every
//! invocation's components back through the element access of `src/spirv/elements.rs`.

use crate::caps::register_layout::{RegisterLayout, COMPONENTS};

/// Measures the layout on a device with cooperative matrices enabled (module docs): the layout,
/// or why it was not measured or does not fit the register softmax.
pub(crate) async fn probe(device: &wgpu::Device, queue: &wgpu::Queue) -> Result<RegisterLayout, String> {
    let lengths = run_probe(device, queue, &length_source(), 2).await?;
    let (lc, la) = (lengths[0] as usize, lengths[1] as usize);
    if lc != COMPONENTS || la != COMPONENTS {
        return Err(format!(
            "components per invocation: accumulator {lc}, A operand {la} (the register softmax needs {COMPONENTS})"
        ));
    }
    let positions = run_probe(device, queue, &positions_source(lc), 2 * 32 * lc).await?;
    let (c, a) = positions.split_at(32 * lc);
    RegisterLayout::from_positions(c, a, lc)
}

// The probes number invocations by subgroup invocation id, as the shuffles that use the layout do.
const PROBE_HEADER: &str = "enable f16;\nenable wgpu_cooperative_matrix;\n\
@group(0) @binding(0) var<storage, read> index32: array<f32>;\n\
@group(0) @binding(1) var<storage, read> index16: array<f16>;\n\
@group(0) @binding(2) var<storage, read_write> out: array<u32>;\n";

fn length_source() -> String {
    format!(
        "{PROBE_HEADER}\
fn coop_length_c(m: coop_mat16x16<f32, C>) -> u32 {{ return 0u; }}\n\
fn coop_length_a(m: coop_mat16x16<f16, A>) -> u32 {{ return 0u; }}\n\
@compute @workgroup_size(32)\n\
fn main(@builtin(local_invocation_index) li: u32) {{\n\
    let c = coopLoadT<coop_mat16x16<f32, C>>(&index32[0], 16u);\n\
    let a = coopLoadT<coop_mat16x16<f16, A>>(&index16[0], 16u);\n\
    let lengths = vec2<u32>(coop_length_c(c), coop_length_a(a));\n\
    if (li == 0u) {{ out[0] = lengths.x; out[1] = lengths.y; }}\n\
}}\n"
    )
}

fn positions_source(components: usize) -> String {
    format!(
        "{PROBE_HEADER}\
fn coop_elements_c(m: coop_mat16x16<f32, C>) -> array<f32, {components}> {{ return array<f32, {components}>(); }}\n\
fn coop_elements_a(m: coop_mat16x16<f16, A>) -> array<f16, {components}> {{ return array<f16, {components}>(); }}\n\
@compute @workgroup_size(32)\n\
fn main(@builtin(subgroup_invocation_id) lane: u32) {{\n\
    let c = coop_elements_c(coopLoadT<coop_mat16x16<f32, C>>(&index32[0], 16u));\n\
    let a = coop_elements_a(coopLoadT<coop_mat16x16<f16, A>>(&index16[0], 16u));\n\
    for (var i = 0u; i < {components}u; i++) {{\n\
        out[lane * {components}u + i] = u32(c[i]);\n\
        out[(32u + lane) * {components}u + i] = u32(f32(a[i]));\n\
    }}\n\
}}\n"
    )
}

/// Dispatches one 32-invocation workgroup of `src` (through src/spirv/, so that the
/// placeholders are filled) on matrices whose element (r, c) holds 16·r + c, and returns the
/// first `words` words of its output.
async fn run_probe(device: &wgpu::Device, queue: &wgpu::Queue, src: &str, words: usize) -> Result<Vec<u32>, String> {
    let index32: Vec<f32> = (0..256).map(|x| x as f32).collect();
    let index16: Vec<half::f16> = (0..256).map(|x| half::f16::from_f32(x as f32)).collect();
    let out = run_one_workgroup(
        device,
        queue,
        ProbeShader::OurSpirv(src),
        [bytemuck::cast_slice(&index32), bytemuck::cast_slice(&index16)],
        &vec![0xffu8; words * 4],
    )
    .await?;
    Ok(bytemuck::pod_collect_to_vec(&out))
}

/// How a probe's WGSL reaches the device: through wgpu's own translation, or as our SPIR-V
/// (src/spirv/: coherent workgroup memory, placeholders filled) passed through.
pub enum ProbeShader<'a> {
    #[cfg_attr(not(feature = "internals"), allow(dead_code))] // only examples/coop_diagnostics.rs
    Wgsl(&'a str),
    OurSpirv(&'a str),
}

/// Runs one 32-invocation workgroup of a probe's `main` with two read-only storage buffers
/// (bindings 0 and 1, holding `inputs`) and one it writes (binding 2, starting as `output`), and
/// returns binding 2's bytes. Errors are the shader's or the device's, as text.
pub async fn run_one_workgroup(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    shader: ProbeShader<'_>,
    inputs: [&[u8]; 2],
    output: &[u8],
) -> Result<Vec<u8>, String> {
    use std::borrow::Cow;
    let upload = |data: &[u8], usage| crate::gpu::readback::upload(device, "probe", data, usage);
    let buffers = [
        upload(inputs[0], wgpu::BufferUsages::empty()),
        upload(inputs[1], wgpu::BufferUsages::empty()),
        upload(output, wgpu::BufferUsages::COPY_SRC),
    ];
    let entry =
        |binding, read_only| crate::spirv::buffer_layout_entry(binding, wgpu::BufferBindingType::Storage { read_only });
    let group_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some("probe"),
        entries: &[entry(0, true), entry(1, true), entry(2, false)],
    });
    let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some("probe"),
        bind_group_layouts: &[Some(&group_layout)],
        immediate_size: 0,
    });
    // Every kind of error the pipeline can raise is caught here: uncaught, wgpu's default
    // handler would panic, and the probe runs when a context is created.
    let scopes = [
        device.push_error_scope(wgpu::ErrorFilter::Validation),
        device.push_error_scope(wgpu::ErrorFilter::OutOfMemory),
        device.push_error_scope(wgpu::ErrorFilter::Internal),
    ];
    let module = match shader {
        ProbeShader::Wgsl(src) => device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("probe"),
            source: wgpu::ShaderSource::Wgsl(Cow::Borrowed(src)),
        }),
        ProbeShader::OurSpirv(src) => {
            let spirv = crate::spirv::compile("probe", src).map_err(|e| e.to_string())?;
            let entry_points = [wgpu::PassthroughShaderEntryPoint {
                name: Cow::Borrowed("main"),
                workgroup_size: (32, 1, 1),
            }];
            // SAFETY: naga's validated translation of the probe, with workgroup accesses and
            // barriers strengthened and placeholder bodies filled (component indices the caller
            // keeps below the device's length).
            unsafe {
                device.create_shader_module_passthrough(wgpu::ShaderModuleDescriptorPassthrough {
                    label: Some("probe"),
                    entry_points: Cow::Borrowed(&entry_points),
                    spirv: Some(Cow::Owned(spirv)),
                    ..Default::default()
                })
            }
        }
    };
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("probe"),
        layout: Some(&layout),
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    // Popped innermost first (each pop takes effect at once), awaited after.
    let popped: Vec<_> = scopes.into_iter().rev().map(|scope| scope.pop()).collect();
    for errors in popped {
        if let Some(e) = errors.await {
            return Err(e.to_string());
        }
    }
    let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("probe"),
        layout: &group_layout,
        entries: &crate::gpu::pipelines::entries_in_order(&[&buffers[0], &buffers[1], &buffers[2]]),
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(1, 1, 1);
    }
    queue.submit([encoder.finish()]);
    let ranges = [(&buffers[2], 0, output.len().next_multiple_of(4) as u64)];
    let mut bytes = crate::gpu::readback::read_back(device, queue, &ranges)
        .await
        .map_err(|e| e.to_string())?;
    Ok(bytes.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the device's probe measures (run on a device with cooperative matrices).
    #[test]
    #[ignore = "diagnostic: run with --ignored --nocapture on a device with cooperative matrices"]
    fn coop_layout_probe() {
        let Ok(mut ctx) = pollster::block_on(crate::device::context::GpuContext::new()) else {
            eprintln!("coop_layout_probe: no GPU");
            return;
        };
        if !ctx.caps.cooperative_matrix_f16 {
            eprintln!("coop_layout_probe: {} has no cooperative matrices", ctx.info.name);
            return;
        }
        let lengths = pollster::block_on(run_probe(&ctx.device, &ctx.queue, &length_source(), 2));
        eprintln!(
            "coop_layout_probe: {}: components per invocation (C, A): {lengths:?}",
            ctx.info.name
        );
        if let Ok(l) = &lengths {
            let n = l[0] as usize;
            if n == COMPONENTS {
                let source = positions_source(n);
                if let Ok(p) = pollster::block_on(run_probe(&ctx.device, &ctx.queue, &source, 64 * n)) {
                    for lane in [0usize, 1, 2, 3, 4, 31] {
                        let at = |base: usize| -> Vec<(u32, u32)> {
                            p[base + lane * n..base + (lane + 1) * n]
                                .iter()
                                .map(|e| (e / 16, e % 16))
                                .collect()
                        };
                        eprintln!("  lane {lane:2}: C {:?}\n           A {:?}", at(0), at(32 * n));
                    }
                }
            }
        }
        pollster::block_on(ctx.probe_register_layout());
        eprintln!(
            "coop_layout_probe: {:?} ({:?})",
            ctx.caps.coop_register_layout, ctx.caps.coop_register_layout_note
        );
    }

    #[test]
    fn the_probe_sources_compile_through_the_placeholder_pass() {
        crate::spirv::compile("length probe", &length_source()).unwrap();
        crate::spirv::compile("position probe", &positions_source(8)).unwrap();
    }
}
