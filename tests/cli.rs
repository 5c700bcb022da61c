//! The `flash-attn` binary as a user runs it, on the best adapter (lavapipe in CI): `info`
//! names the adapter, `check --quick` passes, `bench -o json` gives the documented fields, and
//! bad input is refused with a message. Each run is small: the file takes seconds once the
//! driver's shader cache is warm, well under a minute cold on two cores.
#![cfg(feature = "cli")]

use std::process::{Command, Output};

fn flash_attn(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flash-attn"))
        .args(args)
        .env(
            "XDG_RUNTIME_DIR",
            std::env::var("XDG_RUNTIME_DIR").unwrap_or_else(|_| "/tmp".into()),
        )
        .output()
        .expect("the flash-attn binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn info_names_the_adapter_and_each_path() {
    let out = flash_attn(&["info"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "info failed: {}{}", stdout, text(&out.stderr));
    let chosen = stdout
        .lines()
        .find(|l| l.starts_with('*'))
        .unwrap_or_else(|| panic!("no adapter marked as chosen:\n{stdout}"));
    assert!(chosen.len() > 2, "{chosen}");
    assert!(stdout.contains("capabilities of"), "{stdout}");
    assert!(stdout.contains("f32 causal: flash_fwd_f32_"), "{stdout}");
    assert!(stdout.contains("backward"), "{stdout}");
}

#[test]
fn quick_check_passes_every_row() {
    let out = flash_attn(&["check", "--quick"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "check failed:\n{}{}", stdout, text(&out.stderr));
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("| ")).collect();
    assert!(rows.iter().filter(|r| r.contains("| PASS |")).count() >= 3, "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
    // The forward, naive and backward kernels all appear.
    for kernel in ["flash_fwd_", "naive_", "flash_bwd_"] {
        assert!(rows.iter().any(|r| r.contains(kernel)), "no {kernel} row:\n{stdout}");
    }
}

#[test]
fn bench_json_rows_have_the_documented_fields() {
    let out = flash_attn(&[
        "bench",
        "-o",
        "json",
        "--batch",
        "1",
        "--heads",
        "2",
        "--seq",
        "64,100",
        "--head-dim",
        "32",
        "--reps",
        "2",
        "--warmup",
        "1",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "bench failed:\n{}{}", stdout, text(&out.stderr));
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    assert_eq!(rows.len(), 2, "one row per sequence length:\n{stdout}");
    for row in &rows {
        for field in [
            "adapter",
            "backend",
            "device_type",
            "kernel",
            "dtype",
            "batch",
            "heads",
            "kv_heads",
            "seq_q",
            "seq_kv",
            "head_dim",
            "causal",
            "layout",
            "gflop",
            "clock",
            "reps",
            "flash_ms",
            "flash_min_ms",
            "flash_tflops",
            "kv_tbps",
            "naive_ms",
            "naive_tflops",
            "speedup",
            "check_rows",
            "rel_l2",
            "max_abs",
            "pass",
            "peers",
        ] {
            assert!(row.get(field).is_some(), "no `{field}` in {row}");
        }
        assert!(row["flash_tflops"].as_f64().unwrap_or(0.0) > 0.0, "{row}");
        assert!(row["naive_ms"].as_f64().unwrap_or(0.0) > 0.0, "{row}");
        assert_eq!(row["pass"], serde_json::Value::Bool(true), "{row}");
    }
    assert_eq!(rows[1]["seq_q"], 100);
}

/// `--dropout 0,0.1` runs each problem without and with dropout: the second row on the tiled
/// kernel built with it, checked against float64 (whose mask is the host's), and without the
/// naive baseline, which refuses it.
#[test]
fn bench_sweeps_dropout() {
    let out = flash_attn(&[
        "bench",
        "-o",
        "json",
        "--batch",
        "1",
        "--heads",
        "2",
        "--seq",
        "100",
        "--head-dim",
        "32",
        "--reps",
        "1",
        "--warmup",
        "0",
        "--dropout",
        "0,0.1",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "bench failed:\n{}{}", stdout, text(&out.stderr));
    let rows: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert_eq!(rows[0]["dropout"].as_f64(), Some(0.0), "{stdout}");
    assert!((rows[1]["dropout"].as_f64().unwrap() - 0.1).abs() < 1e-6, "{stdout}");
    assert!(!rows[0]["kernel"].as_str().unwrap().contains("_dropout"), "{stdout}");
    assert!(rows[1]["kernel"].as_str().unwrap().contains("_dropout"), "{stdout}");
    assert!(rows[1]["naive_ms"].is_null(), "{stdout}");
    for row in &rows {
        assert_eq!(row["pass"], serde_json::Value::Bool(true), "{row}");
    }
}

#[test]
fn bad_input_is_refused_with_a_message() {
    // An unknown dtype: clap's usage error.
    let out = flash_attn(&["bench", "--dtype", "f64"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("f64"), "{}", text(&out.stderr));
    // A valid flag, an invalid problem: the library's error, exit status 2, no panic.
    let out = flash_attn(&["bench", "--heads", "3", "--kv-heads", "2", "--seq", "16"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("error:") && !stderr.contains("panicked"), "{stderr}");
}
