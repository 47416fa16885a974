//! `jitship policy new`: writes a new policy crate (`policy::scaffold`).

use std::path::PathBuf;

use anyhow::Result;

use crate::cli::args::PolicyNewArgs;
use crate::policy::scaffold::{NewPolicy, create};

pub(crate) fn run_policy_new(args: PolicyNewArgs) -> Result<i32> {
    let req = NewPolicy {
        kind: args.kind.clone().unwrap_or_else(|| args.name.clone()),
        dir: args
            .dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(&args.name)),
        name: args.name,
    };
    let done = create(&req)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&done)?);
        return Ok(0);
    }
    let dir = done.dir.display();
    println!(
        "created {dir}: policy {} for cache kind {:?}, with jitship-policy-sdk {} in {dir}/sdk",
        done.name, done.kind, done.sdk_version
    );
    match done.template.strip_prefix("builtin:") {
        Some(kind) => println!(
            "  started from jitship's built-in {kind} policy (its root, env variables, key, select, \
             canonicalize, materialize, retention); common/ holds the rules the built-ins share"
        ),
        None => println!(
            "  jitship has no built-in policy for kind {:?}: started from the generic template \
             (built-in kinds: {})",
            done.kind,
            crate::policy::builtin::kinds()
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
    println!("  test it:  cd {dir} && cargo test");
    println!(
        "  build it: jitship policy build {dir} -o {dir}/target/{}.wasm",
        done.crate_name
    );
    println!("  then:     jitship policy check / policy test that module (see {dir}/README.md)");
    Ok(0)
}
