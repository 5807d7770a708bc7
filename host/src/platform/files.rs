//! What the host asks of files beyond reading and writing them.

/// Whether the file at `path` may be read by its group or by others (a
/// token or key in it is then not the owner's alone). False where file
/// modes do not exist, or the file cannot be looked at.
pub fn readable_by_others(path: &std::path::Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).is_ok_and(|metadata| metadata.permissions().mode() & 0o044 != 0)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        false
    }
}
