//! `tollgate token`: credentials for a server started with `--auth`.

use clap::Subcommand;
use tollgate_proto::v1;

use crate::admin::{Target, connect, rpc, utc};
use crate::say;

/// `tollgate token …`.
#[derive(Subcommand)]
pub enum Token {
    /// Make a token and print it, this once (the server keeps only its hash).
    Create {
        /// What it may do: admin (everything), client (exchanges, for --groups), backend
        /// (reports and group settings), reader (status, metrics, settings), region (a
        /// region's controllers: exchanges for every group and the settings, `--upstream`).
        #[arg(long, value_parser = ["admin", "client", "backend", "reader", "region"])]
        role: String,
        /// For a client: the groups it may exchange for, comma-separated, `*` for any run of
        /// characters (`tenant-a*,shared`); default every group.
        #[arg(long, default_value = "")]
        groups: String,
        /// For a client: its unthrottled work is admitted as unthrottled (Couchbase's
        /// Unthrottled privilege); without it, such work is throttled like any other.
        #[arg(long)]
        unthrottled: bool,
        /// For a client: the group its work goes to when a request names none (TiDB's
        /// `ALTER USER … RESOURCE GROUP`); one of its --groups.
        #[arg(long, default_value = "")]
        default_group: String,
        /// Expires after this span (`90s`, `30m`, `12h`, `30d`); default never.
        #[arg(long, value_parser = parse_span)]
        expires: Option<std::time::Duration>,
        /// A label shown by `token list` and in the audit log.
        #[arg(long, default_value = "")]
        name: String,
        /// The token to make, read from this file (`tg_ID_SECRET`, 16 and 64 hex digits,
        /// generated and handed out beforehand); default a new random one, printed.
        #[arg(long, value_name = "FILE")]
        token_file: Option<std::path::PathBuf>,
        /// Print JSON (with the token, when it is new) for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Every token: id, role, groups, privileges, expiry (never the secret).
    List {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by its id, at once and on every controller. The last admin token
    /// cannot be revoked.
    Revoke {
        /// The id `token list` shows.
        id: String,
    },
    /// Set a client token's default group: where its work goes when a request names no
    /// group. `""` removes it.
    SetGroup {
        /// The id `token list` shows.
        id: String,
        /// A group its --groups allow, or `""` for none.
        group: String,
    },
}

fn parse_span(s: &str) -> Result<std::time::Duration, String> {
    match crate::admin::parse_since(s)? {
        crate::admin::Since::Ago(d) if !d.is_zero() => Ok(d),
        _ => Err(format!("expected a span above zero such as 90s, 30m, 12h or 30d; got {s:?}")),
    }
}

fn info_json(t: &v1::TokenInfo) -> serde_json::Value {
    serde_json::json!({
        "id": t.id,
        "role": t.role,
        "name": t.name,
        "groups": t.groups,
        "unthrottled": t.unthrottled,
        "default_group": (!t.default_group.is_empty()).then_some(&t.default_group),
        "created": utc(t.created_unix_ms),
        "expires": (t.expires_unix_ms > 0).then(|| utc(t.expires_unix_ms)),
    })
}

fn info_line(t: &v1::TokenInfo) -> String {
    let expires = if t.expires_unix_ms == 0 { "never".to_string() } else { utc(t.expires_unix_ms) };
    format!(
        "{}  {:<7}  {:<16}  groups {}  unthrottled {}  expires {}{}",
        t.id,
        t.role,
        if t.name.is_empty() { "-" } else { &t.name },
        if t.groups.is_empty() { "*" } else { &t.groups },
        if t.unthrottled { "yes" } else { "no" },
        expires,
        if t.default_group.is_empty() {
            String::new()
        } else {
            format!("  default group {}", t.default_group)
        }
    )
}

/// Runs a `tollgate token` command.
pub async fn run(server: &Target, cmd: Token) -> anyhow::Result<()> {
    let mut client = connect(server).await?;
    match cmd {
        Token::Create { role, groups, unthrottled, default_group, expires, name, token_file, json } => {
            let expires_in_s = expires.map_or(0, |d| d.as_secs().max(1));
            let token = match &token_file {
                Some(file) => crate::read_text(file, 1024)?.trim().to_string(),
                None => String::new(),
            };
            let request = v1::CreateTokenRequest {
                role,
                groups,
                unthrottled,
                expires_in_s,
                name,
                default_group,
                token,
            };
            let made = client.create_token(request).await.map_err(rpc)?.into_inner();
            let info = made.info.unwrap_or_default();
            if json {
                let mut v = info_json(&info);
                if token_file.is_none() {
                    v["token"] = made.token.into();
                }
                say(v.to_string());
            } else if let Some(file) = token_file {
                say(format!("made {}; its token is the one in {}", info_line(&info), file.display()));
            } else {
                say(made.token);
                eprintln(&format!("made {}; the token above is shown this once", info_line(&info)));
            }
        }
        Token::List { json } => {
            let tokens = client.list_tokens(v1::ListTokensRequest {}).await.map_err(rpc)?.into_inner().tokens;
            for t in &tokens {
                say(if json { info_json(t).to_string() } else { info_line(t) });
            }
            if tokens.is_empty() && !json {
                say("no tokens");
            }
        }
        Token::Revoke { id } => {
            let t = client.revoke_token(v1::RevokeTokenRequest { id }).await.map_err(rpc)?.into_inner();
            say(format!("revoked {}", info_line(&t)));
        }
        Token::SetGroup { id, group } => {
            let request = v1::SetTokenGroupRequest { id, default_group: group };
            let t = client.set_token_group(request).await.map_err(rpc)?.into_inner();
            say(info_line(&t));
        }
    }
    Ok(())
}

fn eprintln(note: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{note}");
}
