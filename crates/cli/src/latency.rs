//! `--low-latency`: keeps this node's CPUs out of deep idle states while a command runs.
//!
//! Every Tessera request hops between processes, often between CPUs: application, kernel FUSE,
//! mount, servers and back. A CPU with nothing to run halts; waking it again costs an exit to
//! the hypervisor on a VM, or the exit latency of a deep C-state on bare metal. On the
//! development VM a TCP round trip between two processes on different CPUs took 66-72 us with
//! the CPUs halting and 13-14 us with them polling, and creates through the mount ran 2x
//! faster (BENCHMARKS.md).
//!
//! The Linux PM QoS interface asks for that: while `/dev/cpu_dma_latency` is held open with a
//! target of 0 us written to it, idle CPUs poll instead of halting. The kernel withdraws the
//! request when the file is closed, also when the process dies, so nothing is left behind. The
//! price is idle CPU time burnt polling, on the whole node, hence an option (docs/CLI.md).
//!
//! The target acts through the cpuidle driver, whose governor picks each idle state (polling
//! among them) within it. A kernel that registered none (some VMs boot that way) idles every
//! CPU the architecture's default way, a halt on x86, whatever the target: the request is then
//! held all the same, and a warning says it changes nothing.

use anyhow::{Context, Result};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;

const PM_QOS: &str = "/dev/cpu_dma_latency";
const CPUIDLE_DRIVER: &str = "/sys/devices/system/cpu/cpuidle/current_driver";

/// The request, in force until dropped.
#[derive(Debug)]
pub struct LowLatency {
    _qos: File,
}

impl LowLatency {
    /// Asks the kernel to keep every CPU out of idle states that take any time to leave.
    pub fn hold() -> Result<Self> {
        let held = Self::hold_at(Path::new(PM_QOS))?;
        let driver = std::fs::read_to_string(CPUIDLE_DRIVER).ok();
        if !steers_idle(driver.as_deref()) {
            tracing::warn!(
                "--low-latency changes nothing here: this kernel has no cpuidle driver ({CPUIDLE_DRIVER}: {}), so idle CPUs halt whatever the latency target",
                driver.as_deref().map_or("absent", str::trim)
            );
        }
        Ok(held)
    }

    fn hold_at(path: &Path) -> Result<Self> {
        let mut f = OpenOptions::new().write(true).open(path).with_context(|| {
            format!(
                "--low-latency needs to write {} (root, Linux with PM QoS)",
                path.display()
            )
        })?;
        // The target in microseconds, as a binary 32-bit integer.
        f.write_all(&0i32.to_ne_bytes())
            .with_context(|| format!("writing the latency target to {}", path.display()))?;
        Ok(Self { _qos: f })
    }
}

/// Does a latency target change how this machine's CPUs idle, given its cpuidle driver?
fn steers_idle(driver: Option<&str>) -> bool {
    driver
        .map(str::trim)
        .is_some_and(|d| !d.is_empty() && d != "none")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// The CPU latency target now in force on this machine, in microseconds.
    fn in_force() -> i32 {
        let mut b = [0u8; 4];
        File::open(PM_QOS)
            .and_then(|mut f| f.read_exact(&mut b))
            .expect("reading /dev/cpu_dma_latency (run as root)");
        i32::from_ne_bytes(b)
    }

    #[test]
    fn the_target_holds_while_held_and_goes_with_it() {
        let before = in_force();
        let held = LowLatency::hold().expect("run as root");
        assert_eq!(in_force(), 0);
        drop(held);
        assert_eq!(in_force(), before);
    }

    #[test]
    fn only_a_cpuidle_driver_lets_the_target_steer_idle_cpus() {
        assert!(steers_idle(Some("haltpoll\n")));
        assert!(steers_idle(Some("intel_idle")));
        assert!(!steers_idle(Some("none\n")));
        assert!(!steers_idle(Some("")));
        assert!(!steers_idle(None));
    }

    #[test]
    fn a_missing_interface_is_a_clear_error() {
        let e = LowLatency::hold_at(Path::new("/nonexistent/cpu_dma_latency")).unwrap_err();
        assert!(format!("{e:#}").contains("--low-latency needs"), "{e:#}");
    }
}
