//! CPU facts for engines that compile C++ for the host CPU (TorchInductor on CPU builds every kernel
//! with `-march=native` and the vector ISA tier it picks; docs/inductor-cpu.md#what-the-keys-hold):
//! the ISA tier torch will pick, a digest of the CPU feature flags, the thread count torch will
//! use, the C++ compiler's identity and a digest of the Inductor environment.
//!
//! Each rule restates torch's own logic (torch 2.15, `torch/_inductor/cpu_vec_isa.py`,
//! `pick_vec_isa`; `at::intraop_default_num_threads`), read from /proc/cpuinfo and the variables
//! passed in, so that jitship's key and torch's choice agree without importing torch.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use jitship_generation::{ContentHash, ContentHasher};

use super::command;

/// Inductor's vector ISA tiers, best first, with the `/proc/cpuinfo` flags each needs (torch's
/// `supported_vec_isa_list` filtered by `x86_isa_checker`: `avx512` is cpuinfo's `avx512_f`).
/// A tier needs every word of its torch name (`str(isa)`: AMX is "avx512 avx512_vnni amx_tile").
/// The names are torch's own (`str(isa)`'s last word; `default` is its `INVALID_VEC_ISA`).
const X86_TIERS: &[(&str, &[&str])] = &[
    ("amx_tile", &["avx512f", "avx512_vnni", "amx_tile"]),
    ("avx512_vnni", &["avx512f", "avx512_vnni"]),
    ("avx512", &["avx512f"]),
    ("avx2", &["avx2"]),
];

/// The `flags` of the first processor in a `/proc/cpuinfo` text, sorted and deduplicated.
pub(crate) fn cpu_flags(cpuinfo: &str) -> Option<Vec<String>> {
    let line = cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        matches!(k.trim(), "flags" | "Features").then_some(v)
    })?;
    let mut flags: Vec<String> = line.split_whitespace().map(str::to_string).collect();
    flags.sort();
    flags.dedup();
    (!flags.is_empty()).then_some(flags)
}

/// The tier `pick_vec_isa()` returns on an x86_64 CPU with `flags`, given `ATEN_CPU_CAPABILITY`:
/// unset (or unknown, or naming a tier the CPU lacks: torch warns and ignores it) = the best
/// tier the CPU has; `default` = none; `avx2`/`avx512` = the best valid tier whose name holds it.
pub(crate) fn x86_isa_tier(flags: &[String], capability: Option<&str>) -> &'static str {
    let has = |f: &str| flags.iter().any(|x| x == f);
    let valid: Vec<&'static str> = X86_TIERS
        .iter()
        .filter(|(_, needs)| needs.iter().all(|f| has(f)))
        .map(|(name, _)| *name)
        .collect();
    let Some(best) = valid.first() else {
        return "default";
    };
    match capability {
        Some("default") => "default",
        Some(cap @ ("avx2" | "avx512")) => valid
            .iter()
            // torch matches `isa_str in str(vec_isa)`: "avx512" is in "avx512 avx512_vnni".
            .find(|t| t.starts_with(cap) || (cap == "avx512" && **t == "amx_tile"))
            .unwrap_or(best),
        _ => best,
    }
}

/// `OMP_NUM_THREADS` as libgomp reads it: the first item of a comma list, a positive integer.
fn parse_threads(v: &str) -> Option<usize> {
    v.split(',')
        .next()?
        .trim()
        .parse::<usize>()
        .ok()
        .filter(|n| *n > 0)
}

/// `torch.get_num_threads()` in a fresh process: `OMP_NUM_THREADS` capped by the CPUs the process
/// may run on, else those CPUs (measured with torch 2.15: `OMP_NUM_THREADS=8` on 2 CPUs gives 2,
/// `taskset -c 0` gives 1, an invalid value is ignored). Returns the count and where it came from.
pub(crate) fn torch_threads(
    omp_num_threads: Option<&str>,
    affinity: Option<usize>,
) -> Result<(usize, String), String> {
    let omp = omp_num_threads.and_then(parse_threads);
    match (omp, affinity) {
        (Some(n), Some(cpus)) => Ok((
            n.min(cpus),
            format!("OMP_NUM_THREADS={n}, capped at the {cpus} CPUs of the affinity mask"),
        )),
        (None, Some(cpus)) => Ok((
            cpus,
            match omp_num_threads {
                Some(v) => format!(
                    "the CPUs of the affinity mask (OMP_NUM_THREADS={v:?} is not a positive integer: ignored)"
                ),
                None => "the CPUs of the affinity mask (OMP_NUM_THREADS unset)".to_string(),
            },
        )),
        (_, None) => Err("cannot read this process's CPU affinity mask".into()),
    }
}

/// The number of CPUs in this process's affinity mask (`sched_getaffinity(2)`).
pub(crate) fn affinity_cpus() -> Option<usize> {
    let set = rustix::thread::sched_getaffinity(None).ok()?;
    usize::try_from(set.count()).ok().filter(|n| *n > 0)
}

/// blake3 of the compiler's `-v` output, run as torch runs it: the program `name` (`$CXX` or
/// `g++`) found on `search_path`, with `argv[0]` = `name`, since gcc prints `COLLECT_GCC=<argv[0]>`
/// and torch's ISA-probe key holds that text. Returns the digest and the path that answered.
pub(crate) fn compiler_identity(
    name: &str,
    search_path: &[std::path::PathBuf],
    timeout: Duration,
) -> Result<(String, String), String> {
    let program = if name.contains('/') {
        let p = Path::new(name).to_path_buf();
        command::is_executable(&p)
            .then_some(p)
            .ok_or_else(|| format!("{name} is not an executable file"))?
    } else {
        command::find_in(search_path, name).ok_or_else(|| format!("no {name} on PATH"))?
    };
    let out = command::run_as(&program, name, &["-v"], timeout)?;
    if !out.success {
        return Err(format!("{name} -v failed: {}", out.failure()));
    }
    let text = format!("{}{}", out.stdout, out.stderr);
    if text.trim().is_empty() {
        return Err(format!("{name} -v printed nothing"));
    }
    Ok((
        ContentHash::of(text.as_bytes()).to_hex(),
        format!("{name} -v ({})", program.display()),
    ))
}

/// Variables of the Inductor configuration (every `TORCHINDUCTOR_*` and `TORCH_COMPILE_*`), except
/// `TORCHINDUCTOR_CACHE_DIR`: where the cache lives is in no torch key, and producer and
/// consumer roots differ by design.
pub fn is_inductor_env(name: &str) -> bool {
    (name.starts_with("TORCHINDUCTOR_") || name.starts_with("TORCH_COMPILE_"))
        && name != "TORCHINDUCTOR_CACHE_DIR"
}

/// blake3 of `NAME=value\n` for every Inductor variable in `env`, sorted by name, and the names.
/// None set is a value too (the digest of nothing).
pub(crate) fn inductor_env_digest(env: &BTreeMap<String, String>) -> (String, Vec<&str>) {
    let mut hasher = ContentHasher::new();
    let mut names = Vec::new();
    for (k, v) in env.iter().filter(|(k, _)| is_inductor_env(k)) {
        hasher.update(format!("{k}={v}\n").as_bytes());
        names.push(k.as_str());
    }
    (hasher.finish().to_hex(), names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(s: &str) -> Vec<String> {
        cpu_flags(&format!(
            "processor\t: 0\nflags\t\t: {s}\n\nprocessor\t: 1\nflags\t\t: zzz\n"
        ))
        .unwrap()
    }

    #[test]
    fn tiers_follow_torchs_pick_vec_isa() {
        let zen4 = flags("fpu sse avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16");
        let skx = flags("avx2 fma avx512f avx512bw");
        let spr = flags("avx2 avx512f avx512_vnni amx_tile amx_bf16");
        let amx_no_vnni = flags("avx2 avx512f amx_tile");
        assert_eq!(x86_isa_tier(&amx_no_vnni, None), "avx512");
        let hsw = flags("avx avx2 fma");
        let old = flags("sse sse2 avx");
        assert_eq!(x86_isa_tier(&zen4, None), "avx512_vnni");
        assert_eq!(x86_isa_tier(&skx, None), "avx512");
        assert_eq!(x86_isa_tier(&spr, None), "amx_tile");
        assert_eq!(x86_isa_tier(&hsw, None), "avx2");
        assert_eq!(x86_isa_tier(&old, None), "default");
        // ATEN_CPU_CAPABILITY picks among what the CPU has.
        assert_eq!(x86_isa_tier(&zen4, Some("avx2")), "avx2");
        assert_eq!(x86_isa_tier(&zen4, Some("default")), "default");
        assert_eq!(x86_isa_tier(&zen4, Some("avx512")), "avx512_vnni");
        assert_eq!(x86_isa_tier(&spr, Some("avx512")), "amx_tile");
        // A tier the CPU lacks, or an unknown value, is ignored by torch (with a warning).
        assert_eq!(x86_isa_tier(&hsw, Some("avx512")), "avx2");
        assert_eq!(x86_isa_tier(&zen4, Some("sse9")), "avx512_vnni");
        assert_eq!(x86_isa_tier(&old, Some("avx2")), "default");
    }

    #[test]
    fn flags_come_from_the_first_processor_sorted() {
        assert_eq!(flags("b a b"), vec!["a".to_string(), "b".to_string()]);
        assert_eq!(cpu_flags("processor : 0\nmodel name : x\n"), None);
        assert_eq!(cpu_flags("Features : neon asimd\n").unwrap().len(), 2);
    }

    #[test]
    fn threads_are_omp_capped_by_the_affinity_mask() {
        assert_eq!(torch_threads(None, Some(2)).unwrap().0, 2);
        assert_eq!(torch_threads(Some("1"), Some(2)).unwrap().0, 1);
        assert_eq!(torch_threads(Some("8"), Some(2)).unwrap().0, 2);
        assert_eq!(torch_threads(Some("2,1"), Some(4)).unwrap().0, 2);
        let (n, why) = torch_threads(Some("lots"), Some(3)).unwrap();
        assert_eq!(n, 3);
        assert!(why.contains("ignored"), "{why}");
        assert!(torch_threads(Some("1"), None).is_err());
    }

    #[test]
    fn the_env_digest_covers_inductor_variables_but_not_the_cache_dir() {
        let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let none = inductor_env_digest(&env(&[])).0;
        let moved_env = env(&[("TORCHINDUCTOR_CACHE_DIR", "/a"), ("PATH", "/bin")]);
        let moved = inductor_env_digest(&moved_env);
        assert_eq!(moved.0, none);
        assert!(moved.1.is_empty());
        let pch_off_env = env(&[("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "0")]);
        let pch_off = inductor_env_digest(&pch_off_env).0;
        assert_ne!(pch_off, none);
        let debug_env = env(&[("TORCH_COMPILE_DEBUG", "1")]);
        let debug = inductor_env_digest(&debug_env).0;
        assert_ne!(debug, none);
        assert_ne!(debug, pch_off);
    }
}
