//! The build's identity for `ferry version`, `ferry status` and `ferry_build_info`: the
//! commit and whether the tree had changes (from git, when the sources are a checkout),
//! the target and the compiler.

use vergen_gitcl::{Cargo, Emitter, Gitcl, Rustc};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let git = Gitcl::builder().sha(false).dirty(false).build();
    let cargo = Cargo::builder().target_triple(true).build();
    let rustc = Rustc::builder().semver(true).build();
    // Without git or a checkout, the values fall back to a placeholder (read as unknown)
    // and the build goes on with a warning.
    Emitter::default()
        .add_instructions(&git)?
        .add_instructions(&cargo)?
        .add_instructions(&rustc)?
        .emit()?;
    Ok(())
}
