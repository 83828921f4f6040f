//! Builds the eBPF object from `leaktrace-ebpf` (bpfel target, nightly + bpf-linker, via
//! aya-build) into OUT_DIR, where `src/probes.rs` embeds it with `include_bytes_aligned!`.
//! `cargo xtask setup` installs what this needs on a fresh machine.
use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-changed=../leaktrace-common/src");
    build_demo()?;
    // The fuzz targets (fuzz/, built with `--cfg fuzzing`) exercise parsers only: no eBPF
    // object is built for them (an empty one is embedded).
    if std::env::var_os("CARGO_CFG_FUZZING").is_some() {
        let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR not set")?);
        std::fs::write(out.join("leaktrace"), b"").context("writing the empty eBPF object")?;
        return Ok(());
    }
    if which_bpf_linker().is_none() {
        return Err(anyhow!(
            "bpf-linker is not installed: run `cargo xtask setup` (installs llvm-22-dev, nightly \
             rust-src and bpf-linker), then build again"
        ));
    }
    let ebpf = Package {
        name: "leaktrace-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../leaktrace-ebpf"),
        ..Default::default()
    };
    share_ebpf_target_dir()?;
    aya_build::build_ebpf([ebpf], Toolchain::Nightly).context("building the eBPF object")
}

/// One cargo target directory for the eBPF object's build, shared by every profile and tool.
///
/// aya-build builds the object in `OUT_DIR/aya-build/target/leaktrace-ebpf`, and each build of
/// this script has its own OUT_DIR: `cargo clippy` (whose wrapper gives leaktrace's build script
/// its own hash) and `cargo build --release` each built the same object from nothing (core for
/// bpfel included: minutes on 2 cores). The object's build is the same command whichever
/// profile runs this script (aya-build always passes `--release`, its own target and flags),
/// so that directory is made a link to `<cargo's target directory>/ebpf-build`, where the
/// second build finds the first's artifacts fresh (cargo locks the directory while one builds).
/// The target directory is the nearest ancestor of OUT_DIR holding cargo's `CACHEDIR.TAG`; when
/// none is found, or the directory already exists (an OUT_DIR from before), nothing changes.
fn share_ebpf_target_dir() -> anyhow::Result<()> {
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let Some(target) = out.ancestors().skip(1).find(|d| d.join("CACHEDIR.TAG").is_file()) else { return Ok(()) };
    let link = out.join("aya-build/target/leaktrace-ebpf");
    if link.symlink_metadata().is_ok() {
        return Ok(());
    }
    let shared = target.join("ebpf-build");
    std::fs::create_dir_all(&shared).with_context(|| format!("creating {}", shared.display()))?;
    let parent = link.parent().context("the eBPF target directory has a parent")?;
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    std::os::unix::fs::symlink(&shared, &link)
        .with_context(|| format!("linking {} to {}", link.display(), shared.display()))
}

fn which_bpf_linker() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cargo/bin")))
        .map(|d| d.join("bpf-linker"))
        .find(|p| p.is_file())
}

/// Compile the bundled demo workload (demo/demo.c) so `leaktrace demo` needs no compiler.
fn build_demo() -> anyhow::Result<()> {
    println!("cargo:rerun-if-changed=demo/demo.c");
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = std::process::Command::new(&cc)
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(out.join("leaktrace-demo"))
        .arg("demo/demo.c")
        .status()
        .with_context(|| format!("running the C compiler `{cc}` for the demo (install gcc)"))?;
    anyhow::ensure!(status.success(), "compiling demo/demo.c failed");
    Ok(())
}
