//! `jitship facts` end to end: the binary, a config with [facts] and [gather], a fake
//! nvidia-smi and python on the child's PATH, overrides from JITSHIP_FACTS and --fact.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

fn script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn facts_command_prints_gathered_and_overridden_facts() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, site) = (dir.path().join("bin"), dir.path().join("site"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(site.join("triton-3.4.0.dist-info")).unwrap();
    std::fs::write(
        site.join("triton-3.4.0.dist-info/METADATA"),
        "Name: triton\nVersion: 3.4.0\n",
    )
    .unwrap();
    script(
        &bin.join("nvidia-smi"),
        "echo 'NVIDIA H200, 9.0, 570.86.15'",
    );
    let config = dir.path().join("jitship.toml");
    std::fs::write(
        &config,
        format!(
            "[facts]\n\"model.id\" = \"from-config\"\n\"model.revision\" = \"main\"\n\n[gather]\nsite_packages = [{:?}]\nnvml_library = {:?}\ndriver_version_file = {:?}\n",
            site.display().to_string(),
            dir.path().join("no-nvml.so").display().to_string(),
            dir.path().join("no-driver-file").display().to_string(),
        ),
    )
    .unwrap();
    let run = |args: &[&str], facts_env: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_jitship"));
        cmd.arg("facts").args(args).env_clear().env("PATH", &bin);
        if let Some(v) = facts_env {
            cmd.env("JITSHIP_FACTS", v);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };

    let json = run(
        &["--config", config.to_str().unwrap(), "--json"],
        Some("model.id=from-env;gpu.cc=10.0"),
    );
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["facts"]["gpu.name"], "NVIDIA H200");
    assert_eq!(v["sources"]["gpu.name"]["source"], "nvidia-smi");
    assert_eq!(v["facts"]["driver.major"], "570");
    assert_eq!(v["facts"]["pkg.triton"], "3.4.0");
    assert_eq!(v["facts"]["model.revision"], "main");
    assert_eq!(v["sources"]["model.revision"]["detail"], "config [facts]");
    // The environment beats the config file, and derived facts follow the override.
    assert_eq!(v["facts"]["model.id"], "from-env");
    assert_eq!(v["facts"]["gpu.cc"], "10.0");
    assert_eq!(v["facts"]["gpu.arch"], "sm_100");
    assert!(
        v["missing"]["python.version"]
            .as_str()
            .unwrap()
            .contains("no python3 on PATH")
    );

    // A flag beats both; the human table lists missing facts with their reasons.
    let table = run(
        &[
            "--config",
            config.to_str().unwrap(),
            "--fact",
            "model.id=from-flag",
        ],
        Some("model.id=from-env"),
    );
    let model = table.lines().find(|l| l.starts_with("model.id ")).unwrap();
    assert!(
        model.contains("from-flag") && model.contains("override"),
        "{table}"
    );
    assert!(table.contains("\nmissing ("), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("pkg.torch ") && l.contains("not installed")),
        "{table}"
    );
}
