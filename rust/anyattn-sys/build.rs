//! Builds the anyattn C++ library from this repository with its own CMake project (same sources,
//! same runtime ISA dispatch as every other front end) and links it statically.
//!
//! Also compiles `abi_check.c`, a tiny C file that includes `anyattn.h` and reports the header's
//! struct layouts and enum values, so the tests can check the hand-written Rust declarations.

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let repo_root = manifest_dir
        .join("..")
        .join("..")
        .canonicalize()
        .expect("anyattn-sys must live at rust/anyattn-sys inside the anyattn repository");
    let include_dir = repo_root.join("include");
    if !include_dir.join("anyattn").join("anyattn.h").is_file() {
        panic!(
            "anyattn-sys: {} has no include/anyattn/anyattn.h; this crate builds the C++ \
             library from the repository it lives in",
            repo_root.display()
        );
    }

    for path in ["CMakeLists.txt", "src", "include", "cmake"] {
        println!("cargo:rerun-if-changed={}", repo_root.join(path).display());
    }
    println!("cargo:rerun-if-changed=abi_check.c");
    println!("cargo:rerun-if-env-changed=ANYATTN_SYS_CMAKE_ARGS");

    // Compiled first: the linker must see this archive, which refers to anyattn's symbols,
    // before the anyattn archive that defines them.
    cc::Build::new()
        .file(manifest_dir.join("abi_check.c"))
        .include(&include_dir)
        .flag_if_supported("-std=c99")
        .flag_if_supported("-Werror=incompatible-pointer-types")
        .flag_if_supported("-Werror=implicit-function-declaration")
        .compile("anyattn_sys_abi_check");

    let (lib_dir, lib_name) = build_library(&repo_root);
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=static={lib_name}");
    link_cxx_runtime();
    println!("cargo:include={}", include_dir.display());
}

/// Configures and builds the static library target with CMake; returns the folder holding it and
/// the library's link name.
fn build_library(repo_root: &Path) -> (PathBuf, &'static str) {
    let mut config = cmake::Config::new(repo_root);
    config
        .define("ANYATTN_BUILD_TESTS", "OFF")
        .define("ANYATTN_BUILD_BENCH", "OFF")
        .define("ANYATTN_INSTALL", "OFF")
        .define("ANYATTN_BUILD_SHARED", "OFF")
        .define("ANYATTN_BUILD_STATIC", "ON")
        // The kernels are always optimised: a Debug build of them would make `cargo test` and
        // every debug build of a user's program needlessly slow.
        .profile("Release")
        .build_target("anyattn_static");
    if let Ok(extra) = env::var("ANYATTN_SYS_CMAKE_ARGS") {
        for arg in extra.split_whitespace() {
            config.configure_arg(arg);
        }
    }
    let dst = config.build();
    let build_dir = dst.join("build");
    // CMake names the archive libanyattn.a on Unix and anyattn_static.lib with MSVC.
    for dir in [build_dir.join("src"), build_dir.join("src").join("Release")] {
        if dir.join("libanyattn.a").is_file() {
            return (dir, "anyattn");
        }
        if dir.join("anyattn_static.lib").is_file() {
            return (dir, "anyattn_static");
        }
    }
    panic!(
        "anyattn-sys: CMake finished but no static anyattn library was found under {}",
        build_dir.join("src").display()
    );
}

/// The static library is C++: link its standard library and the threading library.
fn link_cxx_runtime() {
    let target = env::var("TARGET").unwrap_or_default();
    if target.contains("apple") || target.contains("freebsd") || target.contains("openbsd") {
        println!("cargo:rustc-link-lib=dylib=c++");
    } else if target.contains("msvc") {
        // MSVC links its C++ runtime implicitly.
    } else {
        println!("cargo:rustc-link-lib=dylib=stdc++");
    }
    if !target.contains("windows") {
        println!("cargo:rustc-link-lib=dylib=pthread");
    }
}
