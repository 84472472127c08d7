//! The process's own health for `/metrics`, in the names Prometheus's client libraries use
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_open_fds`,
//! `process_max_fds`, `process_start_time_seconds`), read from `/proc` at each scrape.

/// What the process uses, as of one reading.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Usage {
    /// CPU time, user and system, in seconds.
    pub cpu_seconds: f64,
    /// Resident memory, in bytes.
    pub resident_bytes: u64,
    /// File descriptors open.
    pub open_fds: u64,
    /// The open-file limit (soft).
    pub max_fds: u64,
    /// When the process started, Unix seconds.
    pub start_time_seconds: f64,
}

/// Clock ticks a second, the unit `/proc/self/stat` counts CPU time and the start in.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the system; it takes no pointer and touches no
    // memory of ours.
    #[allow(unsafe_code)]
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// This process's usage, or `None` where `/proc` cannot be read (not Linux).
pub(crate) fn usage() -> Option<Usage> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3, so utime (14) is at 11, stime (15) at 12 and
    // starttime (22) at 19.
    let number = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    let ticks = ticks_per_second();
    let cpu_seconds = (number(11)? + number(12)?) / ticks;
    let boot: f64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let start_time_seconds = boot + number(19)? / ticks;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let resident_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let max_fds = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))?
        .split_whitespace()
        .nth(3)
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX);
    Some(Usage { cpu_seconds, resident_bytes: resident_kb * 1024, open_fds, max_fds, start_time_seconds })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The edge of the unsafe call: the tick rate is the system's (100 on Linux), read the
    /// same however often; and what the process uses moves as it works.
    #[test]
    fn the_process_is_read_from_proc_and_moves_as_it_works() {
        assert_eq!(ticks_per_second(), ticks_per_second());
        assert!(ticks_per_second() >= 100.0);
        let before = usage().expect("Linux has /proc");
        let now = crate::clock::wall_ms() as f64 / 1000.0;
        assert!(
            before.start_time_seconds <= now + 1.0 && before.start_time_seconds > now - 3600.0,
            "{before:?}"
        );
        assert!(before.resident_bytes > 1 << 20 && before.open_fds >= 3 && before.max_fds >= before.open_fds);
        let files: Vec<std::fs::File> =
            (0..10).map(|_| std::fs::File::open("/proc/self/stat").unwrap()).collect();
        let mut spin = 0u64;
        while usage().unwrap().cpu_seconds < before.cpu_seconds + 0.02 {
            spin = spin.wrapping_add(std::hint::black_box(1));
        }
        let after = usage().unwrap();
        assert!(after.open_fds >= before.open_fds + 10, "{before:?} {after:?}");
        drop(files);
        assert!(spin > 0);
    }
}
