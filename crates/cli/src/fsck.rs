//! `tessera fsck`: finds the inodes no name reaches (a client died between the steps of a
//! create, unlink or rename) and, with `--repair`, reclaims them.

use crate::up::human;
use anyhow::Result;
use std::time::Duration;
use tessera_client::{Client, Fsck};

#[derive(clap::Args, Debug)]
pub struct FsckArgs {
    /// Delete the unreachable inodes found (and their files' data); without it, only report.
    #[arg(long)]
    repair: bool,
    /// Judge only inodes whose last change (ctime) is at least this old (e.g. 60s, 1m): a
    /// younger one may be a create or rename on its way.
    #[arg(long, default_value = "60s", value_parser = crate::parse_duration)]
    min_age: Duration,
    /// Print the findings as JSON.
    #[arg(long)]
    json: bool,
}

pub async fn run(c: &Client, args: &FsckArgs) -> Result<()> {
    let f = c.fsck(args.min_age, args.repair).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json(&f))?);
        return Ok(());
    }
    println!(
        "{} inodes: {} reached by a name, {} open without a name, {} too young to judge, {} \
         unreachable ({})",
        f.inodes,
        f.reachable,
        f.open,
        f.young,
        f.orphans.len(),
        human(f.bytes(false))
    );
    for o in &f.orphans {
        let i = &o.inode;
        let state = match (args.repair, o.reclaimed) {
            (false, _) => "",
            (true, true) => ": reclaimed",
            (true, false) => ": kept (in use or changed)",
        };
        println!(
            "  inode {:#x}, {:?}, {}{state}",
            i.ino,
            i.kind,
            human(i.size)
        );
    }
    if args.repair {
        let n = f.orphans.iter().filter(|o| o.reclaimed).count();
        println!("reclaimed {n} inodes ({})", human(f.bytes(true)));
    } else if !f.orphans.is_empty() {
        println!("run with --repair to reclaim them");
    }
    Ok(())
}

fn json(f: &Fsck) -> serde_json::Value {
    let orphans: Vec<_> = f
        .orphans
        .iter()
        .map(|o| {
            serde_json::json!({
                "ino": o.inode.ino,
                "kind": format!("{:?}", o.inode.kind),
                "size": o.inode.size,
                "reclaimed": o.reclaimed,
            })
        })
        .collect();
    serde_json::json!({
        "inodes": f.inodes,
        "reachable": f.reachable,
        "open": f.open,
        "young": f.young,
        "orphans": orphans,
        "bytes": f.bytes(false),
        "reclaimed": f.orphans.iter().filter(|o| o.reclaimed).count(),
        "reclaimed_bytes": f.bytes(true),
    })
}
