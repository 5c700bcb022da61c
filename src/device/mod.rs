//! Getting a device and learning what it can do: adapter choice, the features and limits the
//! library asks for, and the probes that measure what no limit reports.

pub mod context;
#[cfg(not(target_arch = "wasm32"))]
pub mod layout_probe;
