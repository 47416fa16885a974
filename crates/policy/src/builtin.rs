//! Built-in policies embedded in the binary, by cache kind, so that `cargo run` works on a machine
//! with only the host target.
//!
//! Each module is `policies/dist/<kind>.wasm`, the component built from `policies/<kind>/` by
//! `policies/build-dist.sh` (the same build as `jitship policy build`). The test `policy_dist` of
//! `jitship-tests` (also `policies/check-dist.sh`) rebuilds every one from source and fails with
//! "policies/dist/<kind>.wasm is stale" unless the committed bytes are exactly what the sources
//! build; `policy_golden` runs every embedded module through the host over fixture trees.

/// One embedded built-in policy.
#[derive(Debug, Clone, Copy)]
pub struct Builtin {
    /// The cache kind it governs (`kind = "..."` in a `[[cache]]`).
    pub kind: &'static str,
    /// Its source crate, relative to the workspace root.
    pub crate_dir: &'static str,
    /// The committed component, relative to the workspace root.
    pub dist: &'static str,
    /// The component's bytes.
    pub wasm: &'static [u8],
}

macro_rules! builtin {
    ($kind:literal) => {
        Builtin {
            kind: $kind,
            crate_dir: concat!("policies/", $kind),
            dist: concat!("policies/dist/", $kind, ".wasm"),
            wasm: include_bytes!(concat!("../../../policies/dist/", $kind, ".wasm")),
        }
    };
}

/// Every built-in policy.
pub const BUILTINS: &[Builtin] = &[
    // Triton kernel cache
    builtin!("triton"),
    // TorchInductor cache
    builtin!("inductor"),
    // TorchInductor precompiled headers ($TMPDIR/torchinductor_$USER/precompiled_headers)
    builtin!("inductor-pch"),
    // vLLM torch.compile cache (AOT and per-graph)
    builtin!("vllm-compile"),
    // vLLM model-inspection cache ($VLLM_CACHE_ROOT/modelinfos)
    builtin!("vllm-modelinfos"),
    // FlashInfer JIT modules
    builtin!("flashinfer-jit"),
    // FlashInfer autotune tables (vLLM)
    builtin!("flashinfer-autotune"),
    // DeepGEMM JIT kernels
    builtin!("deepgemm"),
    // CUDA driver ComputeCache
    builtin!("cuda-computecache"),
    // SGLang kernel JIT cache
    builtin!("sglang-jit"),
    // SGLang piecewise torch.compile cache
    builtin!("sglang-compile"),
    // TileLang kernel cache
    builtin!("tilelang"),
    // CuTe DSL cache
    builtin!("cute-dsl"),
    // TVM-FFI JIT extensions
    builtin!("tvm-ffi"),
];

/// The embedded component for `kind`, if jitship ships one.
pub fn lookup(kind: &str) -> Option<&'static [u8]> {
    BUILTINS
        .iter()
        .find(|b| b.kind == kind)
        .map(|b| b.wasm)
        .filter(|w| !w.is_empty())
}

/// Whether `bytes` are exactly one of the embedded components.
pub fn is_builtin(bytes: &[u8]) -> bool {
    BUILTINS
        .iter()
        .any(|b| !b.wasm.is_empty() && b.wasm == bytes)
}

/// The kinds jitship ships a policy for.
pub fn kinds() -> impl Iterator<Item = &'static str> {
    BUILTINS.iter().map(|b| b.kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_is_a_component_and_kinds_are_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for b in BUILTINS {
            assert!(seen.insert(b.kind), "{} listed twice", b.kind);
            // component-model binary: magic, then version 0x0d and layer 1
            assert!(
                b.wasm.starts_with(b"\0asm\x0d\0\x01\0"),
                "{} is not a component: run policies/build-dist.sh",
                b.dist
            );
            assert_eq!(lookup(b.kind), Some(b.wasm));
        }
        assert_eq!(lookup("no-such-kind"), None);
    }
}
