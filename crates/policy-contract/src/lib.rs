//! # The policy contract's shared values
//!
//! What jitship (the policy host, the facts gatherer, the native rules) and the policy SDK
//! (`jitship-policy-sdk`, and so every policy module) must agree on, in one place: the limits the
//! host enforces on a policy's answers, the one function that cuts a detail to fit, the reason
//! category names, the default refusal of `canonicalize`/`materialize`, the names of the facts
//! jitship gathers, the facts no key may hold and the encoding of a key's parts.
//!
//! `no_std` with `alloc`: nothing here needs more, so it costs a policy module nothing beyond
//! what it uses.

#![no_std]

extern crate alloc;

use alloc::format;
use alloc::string::String;

/// Longest detail of one decision or retention drop, and of a selection's incomplete-detail, in
/// bytes. The host refuses a longer one as a policy failure (`bad-output`); the SDK cuts details
/// to it with [`truncate`], so an SDK policy never trips that check.
///
/// 1 KiB, the value the host has always enforced and `wit/policy.wit` documents ("At most
/// 1 KiB"). The SDK used to cut at 512 under the same name; a smaller cut is not safer, only
/// shorter, and lowering the host's limit instead would make it refuse modules built with
/// contract 3 that answer 513 to 1024 bytes.
pub const MAX_DETAIL_BYTES: usize = 1024;

/// Longest compatibility key a policy may answer (it is hashed into the compat id, but it is also
/// stored in manifests and shown to operators).
pub const MAX_KEY_BYTES: usize = 4096;

/// Longest factor value the SDK's key builder takes (a key holds a handful of factors, well
/// under [`MAX_KEY_BYTES`]).
pub const MAX_FACTOR_BYTES: usize = 256;

/// What [`truncate`] ends a cut text with.
pub const TRUNCATION_MARK: &str = "...";

/// `s` cut to at most `max` bytes at a character boundary, ending with [`TRUNCATION_MARK`] when
/// cut (the mark counts toward `max`). A text of at most `max` bytes is returned as it is.
///
/// ```
/// use jitship_policy_contract::truncate;
/// assert_eq!(truncate("abcdef".into(), 6), "abcdef");
/// assert_eq!(truncate("abcdefg".into(), 6), "abc...");
/// assert_eq!(truncate("éééé".into(), 6), "é...");
/// ```
pub fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max.saturating_sub(TRUNCATION_MARK.len());
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str(TRUNCATION_MARK);
    }
    s
}

/// The names of the decision reason categories (`reason-category` in `wit/policy.wit`), as
/// metric labels, reports and `jitship policy test` show them.
pub mod category {
    /// The one category of a published file.
    pub const COMPLETE: &str = "complete";
    pub const TEMPORARY: &str = "temporary";
    pub const LOCK: &str = "lock";
    pub const PER_HOST: &str = "per-host";
    pub const INCOMPLETE: &str = "incomplete";
    pub const FOREIGN_ROOT: &str = "foreign-root";
    pub const UNPARSEABLE: &str = "unparseable";
    pub const NOT_CACHE: &str = "not-cache";
    pub const EXCLUDED: &str = "excluded";

    /// The categories a skipped file may carry (every one but [`COMPLETE`]), in WIT order.
    pub const SKIP: &[&str] = &[
        TEMPORARY,
        LOCK,
        PER_HOST,
        INCOMPLETE,
        FOREIGN_ROOT,
        UNPARSEABLE,
        NOT_CACHE,
        EXCLUDED,
    ];
}

/// The two root rewrites a policy implements for files it marks `embeds-root`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootRewrite {
    Canonicalize,
    Materialize,
}

impl RootRewrite {
    /// The contract's name of the call.
    pub fn as_str(self) -> &'static str {
        match self {
            RootRewrite::Canonicalize => "canonicalize",
            RootRewrite::Materialize => "materialize",
        }
    }
}

/// Why a policy that marks no file `embeds-root` refuses `rewrite` of `path` (an
/// `invalid-input` error): the default `canonicalize`/`materialize` of the SDK and of jitship's
/// native policies.
///
/// ```
/// use jitship_policy_contract::{RootRewrite, no_root_rewrite};
/// assert_eq!(
///     no_root_rewrite("triton", RootRewrite::Materialize, "a/b.json"),
///     "policy triton marks no file as embedding the root, so it cannot materialize a/b.json"
/// );
/// ```
pub fn no_root_rewrite(policy: &str, rewrite: RootRewrite, path: &str) -> String {
    format!(
        "policy {policy} marks no file as embedding the root, so it cannot {} {path}",
        rewrite.as_str()
    )
}

/// Facts that describe one host or one installation, never a class of workers: keying on them
/// would give every pod (or every image layout) its own key and nothing would be shared. The
/// SDK's `KeyBuilder` refuses them as factors, and jitship's native policy (the generic rules for
/// a kind without a policy module) leaves them out of its key: both read this one list.
pub const PER_HOST_FACTS: &[&str] = &[facts::HOST_NAME, facts::PYTHON_EXECUTABLE];

/// Encodes one part of a key (a kind, a fact name or a value) so that the separators of a key,
/// `;` between factors and `=` between a name and its value, never occur inside a part: `%`, `;`,
/// `=` and control characters (`char::is_control`: newlines, tabs, NUL, ...) become `%XX`, one
/// per UTF-8 byte, upper-case hex. Decoding is unambiguous (`%` itself is encoded), so two
/// different sets of `name=value` parts joined by `;` never give one key.
///
/// Every other character is left as it is: a part made only of ordinary characters (letters,
/// digits, `.`, `/`, `+`, `-`, `_`, `:`, spaces, any non-control Unicode) is byte-identical to
/// the raw text, so the keys, and the compat ids hashed from them, of facts without these
/// characters are the same as before any encoding was applied. The SDK's `KeyBuilder` and
/// jitship's native policy both build keys with this function.
///
/// ```
/// use jitship_policy_contract::encode_key_part;
/// assert_eq!(encode_key_part("Qwen/Qwen3-8B"), "Qwen/Qwen3-8B");
/// assert_eq!(encode_key_part("Q;gpu.arch=sm_80"), "Q%3Bgpu.arch%3Dsm_80");
/// assert_eq!(encode_key_part("50%\n"), "50%25%0A");
/// ```
pub fn encode_key_part(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '%' || c == ';' || c == '=' || c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The names of the facts jitship gathers (`crates/facts/src/lib.rs` documents each: meaning and
/// where it comes from). Policies key on these names; the gatherer writes them.
pub mod facts {
    /// Name of the first GPU, e.g. `NVIDIA H100 80GB HBM3`.
    pub const GPU_NAME: &str = "gpu.name";
    /// Number of GPUs visible.
    pub const GPU_COUNT: &str = "gpu.count";
    /// Compute capability of the first GPU, `major.minor`.
    pub const GPU_CC: &str = "gpu.cc";
    /// SM architecture derived from `gpu.cc`, e.g. `sm_90`.
    pub const GPU_ARCH: &str = "gpu.arch";
    /// NVIDIA driver version, e.g. `550.54.15`.
    pub const DRIVER_VERSION: &str = "driver.version";
    /// Driver branch derived from `driver.version`, e.g. `550`.
    pub const DRIVER_MAJOR: &str = "driver.major";
    /// CUDA version torch was built with, `major.minor`.
    pub const CUDA_RUNTIME: &str = "cuda.runtime";
    /// nvcc release, `major.minor`.
    pub const CUDA_NVCC: &str = "cuda.nvcc";
    /// CUDA toolkit root as the engine's JIT sees it.
    pub const CUDA_HOME: &str = "cuda.home";
    /// Interpreter version with patch level, e.g. `3.12.3`.
    pub const PYTHON_VERSION: &str = "python.version";
    /// The interpreter's `sys.executable` (per host: never keyed, see `PER_HOST_FACTS`).
    pub const PYTHON_EXECUTABLE: &str = "python.executable";
    /// site-packages directories, `:`-separated, in `sys.path` order.
    pub const PYTHON_SITE_PACKAGES: &str = "python.site_packages";
    /// The interpreter's C include directory.
    pub const PYTHON_INCLUDE: &str = "python.include";
    /// Model served (overrides only).
    pub const MODEL_ID: &str = "model.id";
    /// Model revision or commit (overrides only).
    pub const MODEL_REVISION: &str = "model.revision";
    /// blake3 (hex) of the engine's configuration file.
    pub const ENGINE_CONFIG_DIGEST: &str = "engine.config_digest";
    /// Vector ISA tier TorchInductor compiles CPU kernels for.
    pub const CPU_ISA: &str = "cpu.isa";
    /// blake3 (hex) of the CPU's feature flags, sorted.
    pub const CPU_FLAGS_DIGEST: &str = "cpu.flags_digest";
    /// The thread count torch will use.
    pub const CPU_THREADS: &str = "cpu.threads";
    /// blake3 (hex) of the C++ compiler's `-v` output.
    pub const CXX_IDENTITY: &str = "cxx.identity";
    /// blake3 (hex) of the `TORCHINDUCTOR_*` and `TORCH_COMPILE_*` variables.
    pub const INDUCTOR_ENV_DIGEST: &str = "inductor.env_digest";
    /// CPU architecture jitship was built for, e.g. `x86_64`.
    pub const OS_ARCH: &str = "os.arch";
    /// Host name (per host: never keyed, see `PER_HOST_FACTS`).
    pub const HOST_NAME: &str = "host.name";

    /// Every fact above: what the gatherer reports, found or missing, besides `pkg.*`.
    pub const ALL: &[&str] = &[
        GPU_NAME,
        GPU_COUNT,
        GPU_CC,
        GPU_ARCH,
        DRIVER_VERSION,
        DRIVER_MAJOR,
        CUDA_RUNTIME,
        CUDA_NVCC,
        CUDA_HOME,
        PYTHON_VERSION,
        PYTHON_EXECUTABLE,
        PYTHON_SITE_PACKAGES,
        PYTHON_INCLUDE,
        MODEL_ID,
        MODEL_REVISION,
        ENGINE_CONFIG_DIGEST,
        CPU_ISA,
        CPU_FLAGS_DIGEST,
        CPU_THREADS,
        CXX_IDENTITY,
        INDUCTOR_ENV_DIGEST,
        OS_ARCH,
        HOST_NAME,
    ];

    /// What a package version fact's name starts with: `pkg.<name>`, `<name>` the distribution
    /// name lowercased with `-` and `.` turned into `_`.
    pub const PKG_PREFIX: &str = "pkg.";

    /// The package facts of the distributions jitship always asks for (`DEFAULT_PACKAGES` in
    /// `crates/facts/src/lib.rs`).
    pub const PKG_TORCH: &str = "pkg.torch";
    pub const PKG_TRITON: &str = "pkg.triton";
    pub const PKG_VLLM: &str = "pkg.vllm";
    pub const PKG_SGLANG: &str = "pkg.sglang";
    pub const PKG_FLASHINFER_PYTHON: &str = "pkg.flashinfer_python";
    pub const PKG_DEEP_GEMM: &str = "pkg.deep_gemm";
    pub const PKG_TILELANG: &str = "pkg.tilelang";
    pub const PKG_NVIDIA_CUTLASS_DSL: &str = "pkg.nvidia_cutlass_dsl";
    pub const PKG_APACHE_TVM_FFI: &str = "pkg.apache_tvm_ffi";

    /// The package facts above, in `DEFAULT_PACKAGES` order.
    pub const DEFAULT_PKGS: &[&str] = &[
        PKG_TORCH,
        PKG_TRITON,
        PKG_VLLM,
        PKG_SGLANG,
        PKG_FLASHINFER_PYTHON,
        PKG_DEEP_GEMM,
        PKG_TILELANG,
        PKG_NVIDIA_CUTLASS_DSL,
        PKG_APACHE_TVM_FFI,
    ];
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use alloc::string::ToString;
    use alloc::vec::Vec;

    #[test]
    fn truncate_fits_max_at_a_char_boundary() {
        for max in 0..12 {
            for s in ["", "abc", "abcdefghijklmnop", "ééééééé", "a€b€c€d€"] {
                let t = truncate(s.to_string(), max.max(TRUNCATION_MARK.len()));
                assert!(
                    t.len() <= max.max(TRUNCATION_MARK.len()),
                    "{s:?} {max}: {t:?}"
                );
                if s.len() <= max {
                    assert_eq!(t, s);
                }
            }
        }
        let long = "x".repeat(MAX_DETAIL_BYTES + 100);
        assert_eq!(truncate(long, MAX_DETAIL_BYTES).len(), MAX_DETAIL_BYTES);
    }

    #[test]
    fn fact_names_are_distinct_and_well_formed() {
        let all: Vec<&str> = facts::ALL
            .iter()
            .chain(facts::DEFAULT_PKGS)
            .copied()
            .collect();
        let mut sorted = all.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), all.len());
        for n in all {
            assert!(
                n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._".contains(&b)),
                "{n}"
            );
            assert!(n.contains('.'), "{n}");
        }
        for p in facts::DEFAULT_PKGS {
            assert!(p.starts_with(facts::PKG_PREFIX));
        }
        for h in PER_HOST_FACTS {
            assert!(facts::ALL.contains(h));
        }
    }

    #[test]
    fn skip_categories_are_every_category_but_complete() {
        assert_eq!(category::SKIP.len(), 8);
        assert!(!category::SKIP.contains(&category::COMPLETE));
    }
}
