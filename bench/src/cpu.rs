//! A server's CPU time, from `/proc/<pid>/stat`: user plus system time of every thread of the
//! process, including threads that have exited (the kernel folds those into the process's
//! totals). Read before and after the measured interval, the difference is what the server
//! spent serving it.
//!
//! Resolution is one clock tick (10 ms where `CLK_TCK` is 100): over a run of a few seconds at
//! one busy core that is well under 1%.

use std::path::Path;
use std::time::Duration;

use crate::error::{Error, Result};

/// User and system time, in clock ticks, as `/proc/<pid>/stat` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTicks {
    pub user_ticks: u64,
    pub system_ticks: u64,
}

impl CpuTicks {
    pub fn total_ticks(self) -> u64 {
        self.user_ticks + self.system_ticks
    }
}

/// Field positions, 1-based as in proc(5): `utime` is field 14, `stime` field 15.
const UTIME_FIELD: usize = 14;
const STIME_FIELD: usize = 15;
/// The first field after the command name (field 2, the only one that can hold spaces).
const FIRST_FIELD_AFTER_COMM: usize = 3;

/// Parses the text of `/proc/<pid>/stat`.
pub fn parse_stat(text: &str) -> Result<CpuTicks, String> {
    // A process may name itself `a) b`, so the command ends at the LAST parenthesis.
    let after_comm = text
        .rfind(')')
        .map(|i| &text[i + 1..])
        .ok_or("no `)` closing the command name")?;
    let words: Vec<&str> = after_comm.split_ascii_whitespace().collect();
    let field = |n: usize| -> Result<u64, String> {
        let word = words
            .get(n - FIRST_FIELD_AFTER_COMM)
            .ok_or(format!("no field {n}"))?;
        word.parse::<u64>()
            .map_err(|e| format!("field {n} `{word}`: {e}"))
    };
    Ok(CpuTicks {
        user_ticks: field(UTIME_FIELD)?,
        system_ticks: field(STIME_FIELD)?,
    })
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`), the unit of `/proc/<pid>/stat` times.
pub fn ticks_per_second() -> u64 {
    // SAFETY: sysconf only reads a configuration value; it has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    // Linux has answered 100 on every architecture for decades; the fallback is that value.
    u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// The CPU time process `pid` has used so far (user + system, all threads).
pub fn process_cpu_time(pid: u32) -> Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(Path::new(&path)).map_err(|e| Error::ProcStat {
        path: path.clone(),
        problem: e.to_string(),
    })?;
    let ticks = parse_stat(&text).map_err(|problem| Error::ProcStat { path, problem })?;
    Ok(ticks_to_duration(ticks.total_ticks(), ticks_per_second()))
}

fn ticks_to_duration(ticks: u64, ticks_per_second: u64) -> Duration {
    let nanos = u128::from(ticks) * 1_000_000_000 / u128::from(ticks_per_second.max(1));
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real line from a tokio server, with the command name changed to hold spaces and
    /// parentheses: utime (field 14) is 1234, stime (field 15) is 567.
    const LINE: &str = "4242 (tokio (x) y) S 1 4242 4242 0 -1 4194560 2311 0 0 0 1234 567 0 0 20 0 3 0 \
         9911 1073741824 3000 18446744073709551615 1 1 0 0 0 0 0 4096 17922 0 0 0 17 1 0 0 0 0 0";

    #[test]
    fn reads_user_and_system_ticks_past_a_tricky_command_name() {
        let t = parse_stat(LINE).unwrap();
        assert_eq!(
            t,
            CpuTicks {
                user_ticks: 1234,
                system_ticks: 567
            }
        );
        assert_eq!(t.total_ticks(), 1801);
    }

    #[test]
    fn truncated_or_garbled_lines_are_errors() {
        assert!(parse_stat("4242 tokio S 1").is_err(), "no parenthesis");
        assert!(
            parse_stat("4242 (tokio) S 1 2 3").is_err(),
            "too few fields"
        );
        let garbled = LINE.replace(" 1234 ", " 12x4 ");
        assert!(parse_stat(&garbled).is_err());
    }

    #[test]
    fn ticks_convert_at_the_kernel_rate() {
        // 250 ticks at 100 per second: 2.5 s.
        assert_eq!(ticks_to_duration(250, 100), Duration::from_millis(2500));
    }

    #[test]
    fn own_cpu_time_grows_while_this_process_computes() {
        let pid = std::process::id();
        let before = process_cpu_time(pid).unwrap();
        // Spin until the kernel has charged at least two ticks more; bounded so a broken
        // reading fails the test instead of hanging it.
        let give_up = std::time::Instant::now() + Duration::from_secs(20);
        let mut x = 0u64;
        let mut after = before;
        while after < before + Duration::from_millis(20) && std::time::Instant::now() < give_up {
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            after = process_cpu_time(pid).unwrap();
        }
        assert!(
            after >= before + Duration::from_millis(20),
            "{before:?} -> {after:?}"
        );
    }
}
