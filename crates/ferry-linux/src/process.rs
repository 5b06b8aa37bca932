//! The process's own figures for the standard `process_*` metrics Prometheus client
//! libraries export: CPU time, memory, file descriptors, start time. Read from
//! `/proc/self` (and `/proc/stat` for the boot time the start is counted from), as the
//! Go and Python clients read them; the Rust client has no such collector.

use std::fs;
use std::io;

/// The process's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessStats {
    /// User and system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident memory, in bytes.
    pub resident_bytes: u64,
    /// Virtual memory, in bytes.
    pub virtual_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft limit of file descriptors.
    pub max_fds: u64,
    /// When the process started, Unix time in seconds.
    pub start_time_seconds: f64,
}

/// The fields of `/proc/self/stat` text `stat` after the command name (which may hold
/// spaces and parentheses: the last `)` ends it), numbered as proc(5) numbers them from
/// 3 on.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().collect())
}

/// The figures of `stat` (`/proc/self/stat`), `btime` (the boot time of `/proc/stat`),
/// the clock's ticks per second and the page size.
fn parse(stat: &str, btime: u64, ticks: u64, page: u64) -> Option<ProcessStats> {
    let f = stat_fields(stat)?;
    // proc(5): field 14 utime, 15 stime, 22 starttime, 23 vsize, 24 rss; f[0] is 3.
    let field = |n: usize| f.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    let ticks = ticks.max(1) as f64;
    Some(ProcessStats {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        resident_bytes: field(24)? * page,
        virtual_bytes: field(23)?,
        start_time_seconds: btime as f64 + field(22)? as f64 / ticks,
        ..ProcessStats::default()
    })
}

/// The boot time of `/proc/stat` text.
fn boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// This process's figures now.
pub fn stats() -> io::Result<ProcessStats> {
    let bad = |what: &str| io::Error::other(format!("{what}: not as proc(5) says"));
    let stat = fs::read_to_string("/proc/self/stat")?;
    let btime = boot_time(&fs::read_to_string("/proc/stat")?).ok_or_else(|| bad("/proc/stat"))?;
    let ticks = rustix::param::clock_ticks_per_second();
    let page = rustix::param::page_size() as u64;
    let mut s = parse(&stat, btime, ticks, page).ok_or_else(|| bad("/proc/self/stat"))?;
    s.open_fds = fs::read_dir("/proc/self/fd")?.count() as u64;
    s.max_fds = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stat_line_is_read_past_a_command_name_with_spaces() {
        let stat = "4242 (ferry (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1000 104857600 2560 18446744073709551615";
        let s = parse(stat, 1_700_000_000, 100, 4096).unwrap();
        assert_eq!(s.cpu_seconds, 3.0);
        assert_eq!(s.virtual_bytes, 104_857_600);
        assert_eq!(s.resident_bytes, 2560 * 4096);
        assert_eq!(s.start_time_seconds, 1_700_000_010.0);
        assert_eq!(parse("4242 (ferry) S 1", 0, 100, 4096), None);
        assert_eq!(
            boot_time("cpu 1 2\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
    }

    #[test]
    fn this_process_has_figures() {
        let s = stats().unwrap();
        assert!(s.resident_bytes > 0 && s.virtual_bytes >= s.resident_bytes);
        assert!(s.open_fds >= 3 && s.max_fds >= s.open_fds);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(s.start_time_seconds <= now + 1.0 && s.start_time_seconds > now - 3600.0);
    }
}
