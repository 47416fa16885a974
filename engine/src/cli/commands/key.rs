//! `jitship key generate|public`: the publisher's signing key.

use std::path::PathBuf;

use anyhow::{Result, bail};

use crate::cli::args::KeyCommand;
use crate::cli::exit;
use crate::trust::PublisherKey;

pub(crate) fn run_key(cmd: KeyCommand) -> Result<i32> {
    match cmd {
        KeyCommand::Generate(args) => {
            let public_out = args.public_out.unwrap_or_else(|| {
                let mut p = args.out.clone().into_os_string();
                p.push(".pub");
                PathBuf::from(p)
            });
            if public_out.exists() {
                bail!(
                    "{} exists already; jitship never overwrites a key (remove it, or pass --public-out)",
                    public_out.display()
                );
            }
            let key = PublisherKey::generate()?;
            key.save(&args.out)?;
            let public = crate::trust::public_key_text(&key.public_key());
            crate::trust::write_new(&public_out, format!("{public}\n").as_bytes(), 0o644)?;
            eprintln!(
                "private key written to {} (mode 0600); public key to {}; key id {}",
                args.out.display(),
                public_out.display(),
                key.key_id()
            );
            println!("{public}");
        }
        KeyCommand::Public(args) => {
            let key = PublisherKey::load(&args.file)?;
            eprintln!("key id {}", key.key_id());
            println!("{}", crate::trust::public_key_text(&key.public_key()));
        }
    }
    Ok(exit::OK)
}
