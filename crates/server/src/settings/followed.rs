//! Which settings files a server follows (`--config`, `--import FORMAT=FILE`): what the
//! options name, apart from how they are followed ([`crate::settings::files`]).

use std::path::PathBuf;

use crate::settings::import::Format;

/// What a followed file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// Tollgate's settings file (`--config`).
    Config,
    /// Another limiter's limits file (`--import FORMAT=FILE`).
    Import(Format),
}

impl FileKind {
    /// Its name in status: `config`, `envoy-ratelimit` or `limitador`.
    pub fn name(self) -> &'static str {
        match self {
            FileKind::Config => "config",
            FileKind::Import(Format::EnvoyRatelimit) => "envoy-ratelimit",
            FileKind::Import(Format::Limitador) => "limitador",
        }
    }
}

/// A file to follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowedFile {
    /// Where it is.
    pub path: PathBuf,
    /// What it holds.
    pub kind: FileKind,
}

impl FollowedFile {
    /// `--import FORMAT=FILE`: `envoy-ratelimit=…` or `limitador=…`.
    pub fn parse_import(text: &str) -> Result<FollowedFile, String> {
        let (format, path) = text.split_once('=').ok_or_else(|| {
            format!("--import {text:?}: give FORMAT=FILE, FORMAT envoy-ratelimit or limitador")
        })?;
        let format = match format {
            "envoy-ratelimit" => Format::EnvoyRatelimit,
            "limitador" => Format::Limitador,
            other => {
                return Err(format!(
                    "--import {text:?}: format {other:?} is none of envoy-ratelimit, limitador"
                ));
            }
        };
        if path.is_empty() {
            return Err(format!("--import {text:?}: the file is missing"));
        }
        Ok(FollowedFile { path: PathBuf::from(path), kind: FileKind::Import(format) })
    }
}
