//! `jitship policy test` end to end: who rejected what (jitship the input file, or the policy
//! its input), and `--now` for retention dry runs, through the binary and an embedded module.

use std::path::Path;

const MODULE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../policies/dist/triton.wasm");
const FACTS: [&str; 10] = [
    "--fact",
    "gpu.cc=9.0",
    "--fact",
    "pkg.triton=3.9.0",
    "--fact",
    "gpu.arch=sm_90",
    "--fact",
    "driver.major=570",
    "--fact",
    "os.arch=x86_64",
];

fn jitship(args: &[&str]) -> (i32, String, String) {
    jitship_tests::cli::bare(args, &[])
}

fn generations(dir: &Path, entries: &[(&str, u64)]) -> String {
    let list: Vec<_> = entries
        .iter()
        .map(|(id, at)| {
            serde_json::json!({"id": id, "compat_key": "k", "created_at": at,
                               "size_bytes": 1, "file_count": 1})
        })
        .collect();
    let path = dir.join("generations.json");
    std::fs::write(&path, serde_json::to_string(&list).unwrap()).unwrap();
    path.to_str().unwrap().to_owned()
}

/// A short id is jitship's refusal of the file, naming the file, the entry and the id form; never
/// "policy rejected its input".
#[test]
fn a_short_generation_id_is_jitships_rejection_of_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = generations(dir.path(), &[(&"a".repeat(64), 200), ("g2", 100)]);
    let (code, stdout, stderr) = jitship(&["policy", "test", MODULE, "--generations", &file]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!("jitship rejected {file}")),
        "{stderr}"
    );
    assert!(stderr.contains("entry 2"), "{stderr}");
    assert!(stderr.contains("\"g2\""), "{stderr}");
    assert!(stderr.contains("64 lowercase hex digits"), "{stderr}");
    assert!(!stderr.contains("policy rejected"), "{stderr}");

    let (code, stdout, stderr) =
        jitship(&["policy", "test", MODULE, "--generations", &file, "--json"]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["rejected_by"], "jitship", "{v:#}");
    assert!(v["error"].as_str().unwrap().contains("entry 2"), "{v:#}");

    // --help says what form ids take.
    let (_, help, _) = jitship(&["policy", "test", "--help"]);
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(help.contains("64 lowercase hex digits"), "{help}");
    assert!(help.contains("RFC 3339"), "{help}");
}

/// `--now` takes Unix seconds or RFC 3339: the same instant gives the same retention answer, and
/// moving it moves what `--max-age` drops.
#[test]
fn now_as_rfc3339_or_unix_seconds_drives_retention_ages() {
    let dir = tempfile::tempdir().unwrap();
    // 2024-05-01T12:00:00Z = 1714564800; the older generation is 10 days old then.
    let (new, old) = ("1".repeat(64), "2".repeat(64));
    let file = generations(
        dir.path(),
        &[
            (&new, 1_714_564_800 - 3600),
            (&old, 1_714_564_800 - 10 * 86_400),
        ],
    );
    let dropped = |now: &str| {
        let mut args = vec!["policy", "test", MODULE, "--generations", &file];
        args.extend(["--now", now, "--max-age", "7d", "--json"]);
        args.extend(FACTS);
        let (code, stdout, stderr) = jitship(&args);
        assert_eq!(code, 0, "{stdout}{stderr}");
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let drops = v["retain"]["call"]["value"].as_array().unwrap().clone();
        // Each drop says why: this one is over the age limit.
        for d in &drops {
            assert_eq!(d["category"], "age", "{d}");
        }
        let ids: Vec<serde_json::Value> = drops.iter().map(|d| d["id"].clone()).collect();
        serde_json::Value::Array(ids)
    };
    let expected = serde_json::json!([old]);
    assert_eq!(dropped("1714564800"), expected);
    assert_eq!(dropped("2024-05-01T12:00:00Z"), expected);
    assert_eq!(dropped("2024-05-01T14:00:00+02:00"), expected);
    // Five days earlier the old one is 5 days old: kept.
    assert_eq!(dropped("2024-04-26T12:00:00Z"), serde_json::json!([]));

    let (code, _, stderr) = jitship(&["policy", "test", MODULE, "--now", "yesterday"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("RFC 3339"), "{stderr}");
}
