//! This binary's build: its version, commit, profile, target and compiler, as the build
//! script found them.

use ferry_api::BuildInfo;

/// What the build script puts in place of a value it could not find (no git, or not a
/// checkout).
const PLACEHOLDER: &str = "VERGEN_IDEMPOTENT_OUTPUT";

fn known(v: &str) -> String {
    if v.is_empty() || v == PLACEHOLDER {
        "unknown".into()
    } else {
        v.into()
    }
}

/// This build.
pub fn info() -> BuildInfo {
    BuildInfo {
        version: env!("CARGO_PKG_VERSION").into(),
        commit: known(env!("VERGEN_GIT_SHA")),
        dirty: env!("VERGEN_GIT_DIRTY") == "true",
        // (Not cargo's DEBUG, which says debug information: the release profile has
        // some.)
        profile: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
        .into(),
        target: known(env!("VERGEN_CARGO_TARGET_TRIPLE")),
        rustc: known(env!("VERGEN_RUSTC_SEMVER")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_names_its_commit_target_and_compiler() {
        let b = info();
        assert_eq!(b.version, env!("CARGO_PKG_VERSION"));
        assert!(
            b.commit == "unknown"
                || (b.commit.len() == 40 && b.commit.bytes().all(|c| c.is_ascii_hexdigit())),
            "{b:?}"
        );
        assert!(b.target.contains("linux"), "{b:?}");
        assert!(b.rustc.starts_with("1."), "{b:?}");
        assert!(
            b.line()
                .starts_with(&format!("ferry {} (commit ", b.version))
        );
        assert_eq!(known(PLACEHOLDER), "unknown");
    }
}
