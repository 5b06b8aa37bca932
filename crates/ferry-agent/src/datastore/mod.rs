//! Datastores: where the cluster model comes from. `file:DIR` reads a directory of
//! YAML manifests ([`file`]); a Kubernetes API datastore drives the same
//! [`crate::Cluster`] from watches.

pub mod file;

use std::fmt;

/// Something wrong with (or left out of) the manifests, naming where: the file, the line
/// of its document, the object and the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The file, relative to the datastore's directory (the directory itself when the
    /// problem is with it).
    pub file: String,
    /// The line the document starts on, when known.
    pub line: Option<u64>,
    /// The object: `Kind namespace/name`, or `document N` (counting from 1) while its
    /// name is unknown.
    pub object: Option<String>,
    /// The field's path in the object (`spec.ports[1].port`), when one is at fault.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    /// `file[:line]: [object: ][field: ]message`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        if let Some(o) = &self.object {
            write!(f, ": {o}")?;
        }
        if let Some(fd) = &self.field {
            write!(f, ": {fd}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Why a datastore refused the state it read: every problem found, one per line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// The problems, in file order.
    pub problems: Vec<Problem>,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Refused {}
