//! The layout of a tracepoint's records, as the running kernel's tracefs `format` file gives
//! it: checked against the offsets a program reads before it is attached (F29), so a kernel
//! whose records changed is refused by name instead of read as other fields.

use std::path::Path;

/// Where tracefs may be mounted (aya needs it mounted to attach anyway).
const TRACEFS_ROOTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Why a tracepoint's layout was refused.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("cannot read the format of tracepoint {tracepoint} (is tracefs mounted? `cargo xtask setup` mounts it)")]
    Unreadable { tracepoint: String },
    #[error(
        "tracepoint {tracepoint} has no 8-byte field at offset {offset}, which the profiler's program reads: \
         this kernel's records are laid out differently; the profile needing it cannot be taken here"
    )]
    Moved { tracepoint: String, offset: usize },
}

/// (name, offset, size) of each field a `format` file lists.
pub fn fields(format: &str) -> Vec<(String, usize, usize)> {
    format.lines().filter_map(field).collect()
}

/// One `\tfield:u64 clone_flags;\toffset:32;\tsize:8;\tsigned:0;` line.
fn field(line: &str) -> Option<(String, usize, usize)> {
    let mut parts = line.trim().split(';').map(str::trim);
    let declaration = parts.next()?.strip_prefix("field:")?;
    let offset = parts.next()?.strip_prefix("offset:")?.parse().ok()?;
    let size = parts.next()?.strip_prefix("size:")?.parse().ok()?;
    let name = declaration.rsplit(|c: char| c.is_whitespace() || c == '*').next()?;
    let name = name.split('[').next().unwrap_or(name);
    Some((name.to_string(), offset, size))
}

/// Checks that `format` has an 8-byte field at each of `offsets`.
pub fn check(tracepoint: &str, format: &str, offsets: &[usize]) -> Result<(), LayoutError> {
    let fields = fields(format);
    for &offset in offsets {
        if !fields.iter().any(|&(_, at, size)| at == offset && size == 8) {
            return Err(LayoutError::Moved { tracepoint: tracepoint.to_string(), offset });
        }
    }
    Ok(())
}

/// Checks the running kernel's `category:name` against `offsets`.
pub fn check_kernel(category: &str, name: &str, offsets: &[usize]) -> Result<(), LayoutError> {
    let tracepoint = format!("{category}:{name}");
    let format = TRACEFS_ROOTS
        .iter()
        .find_map(|root| {
            std::fs::read_to_string(Path::new(root).join("events").join(category).join(name).join("format")).ok()
        })
        .ok_or_else(|| LayoutError::Unreadable { tracepoint: tracepoint.clone() })?;
    check(&tracepoint, &format, offsets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::tracepoint as tp;

    const NEWTASK: &str = "name: task_newtask\nID: 140\nformat:\n\
        \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
        \tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
        \tfield:pid_t pid;\toffset:8;\tsize:4;\tsigned:1;\n\
        \tfield:char comm[16];\toffset:12;\tsize:16;\tsigned:0;\n\
        \tfield:unsigned long clone_flags;\toffset:32;\tsize:8;\tsigned:0;\n\
        \tfield:short oom_score_adj;\toffset:40;\tsize:2;\tsigned:1;\n";

    #[test]
    fn reads_fields_and_refuses_a_moved_one() {
        let fields = fields(NEWTASK);
        assert!(fields.contains(&("comm".to_string(), 12, 16)));
        assert!(fields.contains(&("clone_flags".to_string(), 32, 8)));
        assert!(check("task:task_newtask", NEWTASK, tp::NEWTASK_FIELDS).is_ok());
        let moved = NEWTASK.replace("offset:32;", "offset:40;");
        let err = check("task:task_newtask", &moved, tp::NEWTASK_FIELDS).unwrap_err();
        assert!(err.to_string().contains("no 8-byte field at offset 32"), "{err}");
    }

    /// This kernel's own records, as the programs read them.
    #[test]
    fn this_kernels_records_are_laid_out_as_the_programs_read_them() {
        let checks = [
            ("syscalls", "sys_enter_futex", tp::FUTEX_ENTER_FIELDS),
            ("syscalls", "sys_exit_futex", tp::SYSCALL_EXIT_FIELDS),
            ("syscalls", "sys_exit_execve", tp::SYSCALL_EXIT_FIELDS),
            ("task", "task_newtask", tp::NEWTASK_FIELDS),
        ];
        for (category, name, offsets) in checks {
            match check_kernel(category, name, offsets) {
                Err(LayoutError::Unreadable { tracepoint }) => {
                    eprintln!("tracefs is not mounted or readable here: {tracepoint} not checked");
                }
                other => assert!(other.is_ok(), "{other:?}"),
            }
        }
    }
}
