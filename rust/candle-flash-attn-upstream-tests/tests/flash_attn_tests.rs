//! candle-flash-attn 0.11.1's `tests/flash_attn_tests.rs`, as `build.rs` generates it from the
//! crates.io package: every test of the file, on `Device::Cpu`, against this workspace's
//! `candle-flash-attn`. The tests `build.rs` lists in `SKIPPED` are marked `#[ignore]`, with the
//! reason.
#![allow(clippy::all)]

include!(concat!(env!("OUT_DIR"), "/flash_attn_tests.rs"));
