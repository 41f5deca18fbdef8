//! The limits of the agent's own cgroup, for `GET /metrics` inside a container: `/proc` shows
//! the host's memory and CPUs, while the sandbox gets what its cgroup allows.
//!
//! Both hierarchies are read, since engines run on either:
//! - **v2** (one tree): `memory.max`, `memory.current`, `memory.stat`, `cpu.max`, `cpu.stat`
//!   in the agent's cgroup directory: `/sys/fs/cgroup` joined with the `0::` line of
//!   `/proc/self/cgroup` (`/` in a container's own cgroup namespace), else `/sys/fs/cgroup`
//!   itself (an engine that mounts the container's cgroup there without a namespace).
//! - **v1** (a tree per controller): `memory.limit_in_bytes`, `memory.usage_in_bytes` and
//!   `memory.stat` under `memory/`, `cpu.cfs_quota_us` and `cpu.cfs_period_us` under `cpu/`,
//!   `cpuacct.usage` under `cpuacct/`, each in the same directory rule.
//!
//! Every file is treated as hostile: read through [`read_bounded`], parsed strictly, and any
//! failure is `None`, which makes the caller fall back to `/proc` for that figure. Nothing here
//! panics or divides by a value it read without checking it.

use std::io::Read as _;
use std::path::{Component, Path, PathBuf};

/// The most any one cgroup or `/proc` file read here may hold; a larger one is not believed.
pub(crate) const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Where the cgroup filesystem is mounted, below the root.
const CGROUP_MOUNT: &str = "sys/fs/cgroup";
/// The agent's cgroup membership, below the root.
const SELF_CGROUP: &str = "proc/self/cgroup";

/// `path`'s text, or `None` when it cannot be opened, holds more than `max` bytes or is not
/// UTF-8.
pub(crate) fn read_bounded(path: &Path, max: u64) -> Option<String> {
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.len() as u64 > max {
        return None;
    }
    String::from_utf8(bytes).ok()
}

/// The CPU time a cgroup may use: `quota` microseconds in each `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CpuQuota {
    pub(crate) quota_usec: u64,
    pub(crate) period_usec: u64,
}

impl CpuQuota {
    /// A quota only when both are positive (a zero period would divide by zero).
    fn new(quota_usec: u64, period_usec: u64) -> Option<CpuQuota> {
        (quota_usec > 0 && period_usec > 0).then_some(CpuQuota {
            quota_usec,
            period_usec,
        })
    }

    /// Whole CPUs the quota amounts to, rounded up, at least 1 and at most `cpus` (a quota
    /// above the machine's CPUs cannot be used).
    pub(crate) fn cpu_count(self, cpus: u32) -> u32 {
        let whole = self.quota_usec.div_ceil(self.period_usec).max(1);
        u32::try_from(whole).unwrap_or(u32::MAX).min(cpus.max(1))
    }

    /// The CPUs' worth of time the quota allows, at most `cpus`.
    pub(crate) fn capacity(self, cpus: u32) -> f64 {
        #[expect(
            clippy::cast_precision_loss,
            reason = "microsecond quotas far below 2^52; the answer is a percentage's divisor"
        )]
        let share = self.quota_usec as f64 / self.period_usec as f64;
        share.min(f64::from(cpus.max(1)))
    }
}

/// Memory of the cgroup, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CgroupMemory {
    /// The limit.
    pub(crate) limit: u64,
    /// In use, less the inactive page cache the kernel reclaims first (as `docker stats`
    /// counts it), so reading files does not look like using memory.
    pub(crate) used: u64,
}

/// One hierarchy's files, found once at the agent's start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cgroup {
    /// The unified hierarchy: one directory.
    V2(PathBuf),
    /// A directory per controller, each optional.
    V1 {
        memory: Option<PathBuf>,
        cpu: Option<PathBuf>,
        cpuacct: Option<PathBuf>,
    },
    /// Neither: every figure comes from `/proc`.
    None,
}

impl Cgroup {
    /// The agent's cgroup on this machine.
    pub(crate) fn find() -> Cgroup {
        Cgroup::find_in(Path::new("/"))
    }

    /// The cgroup of the process whose filesystem root is `root` (tests pass a directory laid
    /// out like one).
    pub(crate) fn find_in(root: &Path) -> Cgroup {
        let mount = root.join(CGROUP_MOUNT);
        let membership = read_bounded(&root.join(SELF_CGROUP), MAX_FILE_BYTES).unwrap_or_default();
        if mount.join("cgroup.controllers").is_file() {
            return Cgroup::V2(own_dir(
                &mount,
                membership_path(&membership, |c| c.is_empty()),
            ));
        }
        let controller = |name: &str| {
            let base = mount.join(name);
            base.is_dir().then(|| {
                let path = membership_path(&membership, |list| list.split(',').any(|c| c == name));
                own_dir(&base, path)
            })
        };
        let (memory, cpu, cpuacct) = (
            controller("memory"),
            controller("cpu"),
            controller("cpuacct"),
        );
        if memory.is_none() && cpu.is_none() && cpuacct.is_none() {
            return Cgroup::None;
        }
        Cgroup::V1 {
            memory,
            cpu,
            cpuacct,
        }
    }

    /// The memory limit and use, when the cgroup sets a limit.
    pub(crate) fn memory(&self) -> Option<CgroupMemory> {
        let (dir, limit, usage, inactive) = match self {
            Cgroup::V2(dir) => (dir, "memory.max", "memory.current", "inactive_file"),
            Cgroup::V1 {
                memory: Some(dir), ..
            } => (
                dir,
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "total_inactive_file",
            ),
            Cgroup::V1 { memory: None, .. } | Cgroup::None => return None,
        };
        let limit = parse_limit(&read_bounded(&dir.join(limit), MAX_FILE_BYTES)?)?;
        let usage = parse_number(&read_bounded(&dir.join(usage), MAX_FILE_BYTES)?)?;
        let inactive = read_bounded(&dir.join("memory.stat"), MAX_FILE_BYTES)
            .and_then(|stat| stat_field(&stat, inactive))
            .unwrap_or(0);
        Some(CgroupMemory {
            limit,
            used: usage.saturating_sub(inactive).min(limit),
        })
    }

    /// The CPU quota, when the cgroup sets one.
    pub(crate) fn cpu_quota(&self) -> Option<CpuQuota> {
        match self {
            Cgroup::V2(dir) => parse_cpu_max(&read_bounded(&dir.join("cpu.max"), MAX_FILE_BYTES)?),
            Cgroup::V1 { cpu: Some(dir), .. } => {
                let quota = read_bounded(&dir.join("cpu.cfs_quota_us"), MAX_FILE_BYTES)?;
                let period = read_bounded(&dir.join("cpu.cfs_period_us"), MAX_FILE_BYTES)?;
                // -1 is "no quota", which is no number of microseconds.
                CpuQuota::new(parse_number(&quota)?, parse_number(&period)?)
            }
            Cgroup::V1 { cpu: None, .. } | Cgroup::None => None,
        }
    }

    /// CPU time the cgroup has used, in microseconds.
    pub(crate) fn cpu_usage_usec(&self) -> Option<u64> {
        match self {
            Cgroup::V2(dir) => stat_field(
                &read_bounded(&dir.join("cpu.stat"), MAX_FILE_BYTES)?,
                "usage_usec",
            ),
            Cgroup::V1 {
                cpuacct: Some(dir), ..
            } => {
                let nanos =
                    parse_number(&read_bounded(&dir.join("cpuacct.usage"), MAX_FILE_BYTES)?)?;
                Some(nanos / 1000)
            }
            Cgroup::V1 { cpuacct: None, .. } | Cgroup::None => None,
        }
    }
}

/// The path of the `/proc/self/cgroup` line whose controller list `wanted` accepts (`0::/x`
/// has the empty list of v2; `4:memory:/x` and `2:cpu,cpuacct:/x` are v1's).
fn membership_path(text: &str, wanted: impl Fn(&str) -> bool) -> Option<&str> {
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_id, list, path) = (parts.next()?, parts.next()?, parts.next()?);
        wanted(list).then_some(path)
    })
}

/// `base` joined with the cgroup `path` when that directory exists (the cgroup namespace is the
/// host's, so the mount shows the whole tree), else `base` (the engine mounted the container's
/// own cgroup there). A path with anything but plain names in it is not followed.
fn own_dir(base: &Path, path: Option<&str>) -> PathBuf {
    let Some(path) = path else {
        return base.to_path_buf();
    };
    let relative = Path::new(path.trim_start_matches('/'));
    if relative.as_os_str().is_empty()
        || !relative
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
    {
        return base.to_path_buf();
    }
    let joined = base.join(relative);
    if joined.is_dir() {
        joined
    } else {
        base.to_path_buf()
    }
}

/// One unsigned decimal number and an optional final newline, nothing else.
pub(crate) fn parse_number(text: &str) -> Option<u64> {
    let digits = text.strip_suffix('\n').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A memory limit: a number of bytes. `max` (v2) is no limit, and so is v1's "unlimited", a
/// number near 2^63 that no machine has.
pub(crate) fn parse_limit(text: &str) -> Option<u64> {
    let limit = parse_number(text)?;
    (limit > 0 && limit < 1 << 62).then_some(limit)
}

/// `cpu.max`: `<quota> <period>`, or `max <period>` for no quota.
pub(crate) fn parse_cpu_max(text: &str) -> Option<CpuQuota> {
    let line = text.strip_suffix('\n').unwrap_or(text);
    let (quota, period) = line.split_once(' ')?;
    CpuQuota::new(parse_number(quota)?, parse_number(period)?)
}

/// The value of `key` in a flat keyed file (`cpu.stat`, `memory.stat`: `key value` lines).
pub(crate) fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        if k == key { parse_number(v) } else { None }
    })
}

/// Percent of the quota's capacity (`capacity` CPUs) used by `used_usec` of CPU time over
/// `wall_usec` of wall time, rounded to 2 decimals, within 0 and 100; 0 when no time passed.
pub(crate) fn quota_pct(used_usec: u64, wall_usec: u64, capacity: f64) -> f32 {
    #[expect(
        clippy::cast_precision_loss,
        reason = "microsecond counts far below 2^52; the answer is a percentage"
    )]
    let allowed = wall_usec as f64 * capacity;
    // NaN (a NaN capacity) is no time allowed either.
    if allowed.is_nan() || allowed <= 0.0 {
        return 0.0;
    }
    #[expect(
        clippy::cast_precision_loss,
        reason = "microsecond counts far below 2^52; the answer is a percentage"
    )]
    let pct = (used_usec as f64 * 100.0 / allowed).clamp(0.0, 100.0);
    #[expect(
        clippy::cast_possible_truncation,
        reason = "a percentage between 0 and 100 fits f32"
    )]
    let pct = ((pct * 100.0).round() / 100.0) as f32;
    pct
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn write(root: &Path, path: &str, text: &str) {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn numbers_are_strict() {
        assert_eq!(parse_number("268435456\n"), Some(268_435_456));
        assert_eq!(parse_number("0"), Some(0));
        for bad in [
            "",
            "\n",
            "-1\n",
            "+5",
            " 5",
            "5 ",
            "5\n\n",
            "1e9",
            "max\n",
            "99999999999999999999",
        ] {
            assert_eq!(parse_number(bad), None, "{bad:?}");
        }
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None, "v1's unlimited");
        assert_eq!(parse_limit("0\n"), None);
        assert_eq!(parse_limit("268435456\n"), Some(268_435_456));
    }

    #[test]
    fn cpu_max_is_a_quota_and_a_period() {
        let q = |quota, period| Some(CpuQuota::new(quota, period).unwrap());
        assert_eq!(parse_cpu_max("100000 100000\n"), q(100_000, 100_000));
        assert_eq!(parse_cpu_max("150000 100000"), q(150_000, 100_000));
        for bad in [
            "max 100000\n",
            "100000 0\n",
            "0 100000\n",
            "100000\n",
            "100000  100000",
            "a b",
            "",
        ] {
            assert_eq!(parse_cpu_max(bad), None, "{bad:?}");
        }
        let one_and_a_half = CpuQuota::new(150_000, 100_000).unwrap();
        assert_eq!(one_and_a_half.cpu_count(8), 2, "rounded up");
        assert_eq!(one_and_a_half.cpu_count(1), 1, "never above the machine's");
        assert_eq!(
            CpuQuota::new(1, 100_000).unwrap().cpu_count(8),
            1,
            "at least 1"
        );
        assert_eq!(CpuQuota::new(u64::MAX, 1).unwrap().cpu_count(4), 4);
        assert_eq!(one_and_a_half.capacity(8), 1.5);
        assert_eq!(one_and_a_half.capacity(1), 1.0);
    }

    #[test]
    fn keyed_files_give_their_fields() {
        let stat = "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\n";
        assert_eq!(stat_field(stat, "usage_usec"), Some(123_456));
        assert_eq!(stat_field(stat, "user_usec"), Some(100_000));
        assert_eq!(stat_field(stat, "usage"), None);
        assert_eq!(stat_field("usage_usec x\n", "usage_usec"), None);
        assert_eq!(stat_field("usage_usec -5\n", "usage_usec"), None);
    }

    #[test]
    fn the_quota_percentage_is_against_the_quota_not_the_machine() {
        // One CPU's quota, used fully for a second.
        assert_eq!(quota_pct(1_000_000, 1_000_000, 1.0), 100.0);
        // Half a CPU's quota, a quarter of a second of CPU in a second: half of it.
        assert_eq!(quota_pct(250_000, 1_000_000, 0.5), 50.0);
        assert_eq!(quota_pct(1, 3, 1.0), 33.33);
        // More than the quota (accounting slack) is 100, no time passed is 0.
        assert_eq!(quota_pct(5_000_000, 1_000_000, 1.0), 100.0);
        assert_eq!(quota_pct(5, 0, 1.0), 0.0);
        assert_eq!(quota_pct(5, 10, 0.0), 0.0);
        assert_eq!(quota_pct(5, 10, f64::NAN), 0.0);
    }

    #[test]
    fn a_v2_cgroup_gives_its_limits() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(r, "proc/self/cgroup", "0::/\n");
        write(r, "sys/fs/cgroup/cgroup.controllers", "cpu memory pids\n");
        write(r, "sys/fs/cgroup/memory.max", "268435456\n");
        write(r, "sys/fs/cgroup/memory.current", "100000000\n");
        write(
            r,
            "sys/fs/cgroup/memory.stat",
            "anon 1\nfile 20000000\ninactive_file 30000000\nactive_file 5\n",
        );
        write(r, "sys/fs/cgroup/cpu.max", "100000 100000\n");
        write(
            r,
            "sys/fs/cgroup/cpu.stat",
            "usage_usec 5000\nuser_usec 4000\n",
        );
        let cgroup = Cgroup::find_in(r);
        assert_eq!(cgroup, Cgroup::V2(r.join("sys/fs/cgroup")));
        assert_eq!(
            cgroup.memory(),
            Some(CgroupMemory {
                limit: 268_435_456,
                used: 70_000_000
            })
        );
        assert_eq!(cgroup.cpu_quota(), CpuQuota::new(100_000, 100_000));
        assert_eq!(cgroup.cpu_usage_usec(), Some(5000));
        // No limits: nothing to report, so the caller reads /proc.
        write(r, "sys/fs/cgroup/memory.max", "max\n");
        write(r, "sys/fs/cgroup/cpu.max", "max 100000\n");
        assert_eq!((cgroup.memory(), cgroup.cpu_quota()), (None, None));
        // Hostile contents are no figure, never a panic.
        write(r, "sys/fs/cgroup/memory.max", "268435456\n");
        write(r, "sys/fs/cgroup/memory.current", "lots\n");
        write(r, "sys/fs/cgroup/cpu.max", "100000 0\n");
        write(r, "sys/fs/cgroup/cpu.stat", "usage_usec -1\n");
        assert_eq!(
            (cgroup.memory(), cgroup.cpu_quota(), cgroup.cpu_usage_usec()),
            (None, None, None)
        );
        // Over the bound: not believed.
        let huge = "1".repeat(usize::try_from(MAX_FILE_BYTES).unwrap() + 1);
        write(r, "sys/fs/cgroup/memory.current", &huge);
        assert_eq!(cgroup.memory(), None);
        // Usage above the limit (or a cache figure above usage) stays within the limit.
        write(r, "sys/fs/cgroup/memory.current", "999999999\n");
        write(r, "sys/fs/cgroup/memory.stat", "inactive_file 5\n");
        assert_eq!(cgroup.memory().map(|m| m.used), Some(268_435_456));
    }

    #[test]
    fn a_v2_membership_under_the_hosts_tree_is_followed_and_nothing_else() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(r, "sys/fs/cgroup/cgroup.controllers", "cpu memory\n");
        write(
            r,
            "sys/fs/cgroup/system.slice/box.scope/memory.max",
            "1000\n",
        );
        write(r, "proc/self/cgroup", "0::/system.slice/box.scope\n");
        assert_eq!(
            Cgroup::find_in(r),
            Cgroup::V2(r.join("sys/fs/cgroup/system.slice/box.scope"))
        );
        // A path that climbs, or names a directory that is not there, stays at the mount.
        for membership in [
            "0::/../../etc\n",
            "0::/system.slice/gone.scope\n",
            "0::\n",
            "garbage",
        ] {
            write(r, "proc/self/cgroup", membership);
            assert_eq!(
                Cgroup::find_in(r),
                Cgroup::V2(r.join("sys/fs/cgroup")),
                "{membership:?}"
            );
        }
    }

    #[test]
    fn a_v1_cgroup_gives_its_limits() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        // The engine mounts the container's own cgroups at each controller's directory, while
        // the membership names the host's path.
        write(
            r,
            "proc/self/cgroup",
            "4:memory:/docker/abc\n2:cpuacct:/docker/abc\n1:cpu:/docker/abc\n0::/docker/abc\n",
        );
        write(
            r,
            "sys/fs/cgroup/memory/memory.limit_in_bytes",
            "268435456\n",
        );
        write(
            r,
            "sys/fs/cgroup/memory/memory.usage_in_bytes",
            "50000000\n",
        );
        write(
            r,
            "sys/fs/cgroup/memory/memory.stat",
            "cache 1\ninactive_file 7\ntotal_inactive_file 10000000\n",
        );
        write(r, "sys/fs/cgroup/cpu/cpu.cfs_quota_us", "50000\n");
        write(r, "sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
        write(r, "sys/fs/cgroup/cpuacct/cpuacct.usage", "7000000\n");
        let cgroup = Cgroup::find_in(r);
        assert_eq!(
            cgroup.memory(),
            Some(CgroupMemory {
                limit: 268_435_456,
                used: 40_000_000
            })
        );
        assert_eq!(cgroup.cpu_quota(), CpuQuota::new(50_000, 100_000));
        assert_eq!(cgroup.cpu_usage_usec(), Some(7000));
        // Unlimited, as v1 writes it.
        write(
            r,
            "sys/fs/cgroup/memory/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        write(r, "sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n");
        assert_eq!((cgroup.memory(), cgroup.cpu_quota()), (None, None));
    }

    #[test]
    fn without_a_cgroup_filesystem_there_is_nothing_to_read() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(Cgroup::find_in(root.path()), Cgroup::None);
        assert_eq!(Cgroup::None.memory(), None);
        assert_eq!(Cgroup::None.cpu_quota(), None);
        assert_eq!(Cgroup::None.cpu_usage_usec(), None);
    }
}
