//! `tollgate sql`: TiDB's resource-group statements, run against a controller.
//!
//! ```text
//! CREATE RESOURCE GROUP [IF NOT EXISTS] name RU_PER_SEC = n [PRIORITY = LOW|MEDIUM|HIGH|1-16] [BURSTABLE] [PARENT = g]
//! ALTER RESOURCE GROUP name [RU_PER_SEC = n] [PRIORITY = …] [BURSTABLE [= TRUE|FALSE]] [PARENT = g|NULL]
//! DROP RESOURCE GROUP [IF EXISTS] name
//! SHOW RESOURCE GROUPS
//! SHOW CREATE RESOURCE GROUP name
//! SET GLOBAL tidb_enable_resource_control = ON|OFF
//! CREATE USER [IF NOT EXISTS] name[@'%'] [RESOURCE GROUP g]
//! ALTER USER name[@'%'] RESOURCE GROUP g
//! DROP USER [IF EXISTS] name[@'%']
//! ```
//!
//! Keywords are case-insensitive, the `=` and the commas between options are optional, and
//! several statements are separated by `;`. Every statement is parsed before any runs, so a
//! mistake anywhere runs nothing; an error names the token it stopped at, with its line and
//! column. `RU_PER_SEC = n` reserves n units/s and limits the group to n, unless it is
//! `BURSTABLE`, which lifts the limit (TiDB's resource control reads the same way).
//! `PARENT = g` is Tollgate's own: it nests the group under `g` (hierarchical quotas), and
//! `PARENT = NULL` makes it a group of its own again.
//! `SET GLOBAL tidb_enable_resource_control = OFF` is the one switch: throttling off for the
//! whole node, every group kept (`ON` turns it back on).
//!
//! A user is a client token named after it (a server run with `--auth`): `CREATE USER` makes
//! one and prints it, this once; its `RESOURCE GROUP` is the token's default group, where work
//! that names no group goes (TiDB's binding of users to resource groups). `ALTER USER` changes
//! it, `DROP USER` revokes the token. A user's host may only be `'%'` (a token is not tied
//! to a host), and there is no password: the token is the credential.
//!
//! TiDB's other bindings of work to a group are refused with what does the same here: `SET
//! RESOURCE GROUP` (a session's queries: bind the user, or name the group with each call), the
//! `/*+ RESOURCE_GROUP(g) */` hint (one query's: the call's own `group`) and `IDENTIFIED BY`
//! (the token is the credential).

use std::fmt::Write as _;

use anyhow::bail;
use tollgate_proto::v1;

use crate::admin::{self, Target};
use crate::say;

/// What to write instead of TiDB's `RESOURCE_GROUP()` hint.
const HINT_INSTEAD: &str = "an optimizer hint (/*+ RESOURCE_GROUP(g) */) binds one query's work to a group, and \
     here there is no query: a client names the group with each call instead (the `group` of \
     /v1/check and /v1/charge, Tollgate::group(\"g\") in Rust, limiter.acquire(\"g\") in Python), \
     which overrides its token's default group as the hint overrides the user's";

/// What to write instead of TiDB's `SET RESOURCE GROUP`.
const SESSION_INSTEAD: &str = "SET RESOURCE GROUP binds a session's queries to a group, and tollgate sql runs no \
     queries: bind a user's work with ALTER USER name RESOURCE GROUP g (its token's default \
     group), or name the group with each call (the `group` of /v1/check, Tollgate::group(\"g\"))";

/// What to write instead of a password.
const PASSWORD_INSTEAD: &str = "a user has no password here: CREATE USER name [RESOURCE GROUP g] prints the user's \
     token, its credential (a client sends it as `authorization: Bearer TOKEN`)";

/// The longest text `tollgate sql` takes, in bytes.
pub const SQL_MAX_BYTES: usize = 1 << 20;
/// The most statements one run takes.
pub const STATEMENTS_MAX: usize = 10_000;

/// A TiDB priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// 1 on Tollgate's scale.
    Low,
    /// 8.
    Medium,
    /// 16.
    High,
    /// A level from 1 to 16, Tollgate's own scale.
    Level(u32),
}

impl Priority {
    fn level(self) -> u32 {
        match self {
            Priority::Low => 1,
            Priority::Medium => 8,
            Priority::High => 16,
            Priority::Level(n) => n,
        }
    }
}

/// The options of a CREATE or ALTER; each at most once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Options {
    /// `RU_PER_SEC = n`.
    pub ru_per_sec: Option<f64>,
    /// `PRIORITY = …`.
    pub priority: Option<Priority>,
    /// `BURSTABLE` (true) or `BURSTABLE = FALSE`.
    pub burstable: Option<bool>,
    /// `PARENT = g` (`Some(Some(g))`) or `PARENT = NULL` (`Some(None)`).
    pub parent: Option<Option<String>>,
}

/// One statement.
#[derive(Clone, Debug, PartialEq)]
pub enum Statement {
    /// `CREATE RESOURCE GROUP`.
    Create { name: String, if_not_exists: bool, options: Options },
    /// `ALTER RESOURCE GROUP`.
    Alter { name: String, options: Options },
    /// `DROP RESOURCE GROUP`.
    Drop { name: String, if_exists: bool },
    /// `SHOW RESOURCE GROUPS`.
    ShowAll,
    /// `SHOW CREATE RESOURCE GROUP name`.
    ShowCreate { name: String },
    /// `SET GLOBAL tidb_enable_resource_control = ON|OFF`: the one switch.
    SetThrottling { on: bool },
    /// `CREATE USER`: a client token named `name`, with a default group or none.
    CreateUser { name: String, if_not_exists: bool, group: Option<String> },
    /// `ALTER USER … RESOURCE GROUP`: the named token's default group.
    AlterUser { name: String, group: String },
    /// `DROP USER`: revokes the named token.
    DropUser { name: String, if_exists: bool },
}

#[derive(Clone, Debug, PartialEq)]
enum Kind {
    Word(String),
    Quoted(String),
    Number(String),
    Equals,
    Comma,
    Semicolon,
    /// A character no statement uses; the parser names it where it stops.
    Other(char),
}

#[derive(Clone, Debug)]
struct Token {
    kind: Kind,
    /// Byte offset in the text.
    at: usize,
}

/// A mistake in the text: where, and what was wrong.
#[derive(Debug, PartialEq)]
pub struct SqlError {
    /// 1-based line and column (in characters).
    pub line: usize,
    /// See `line`.
    pub column: usize,
    /// What was found and what was expected.
    pub message: String,
}

impl std::fmt::Display for SqlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}, column {}: {}", self.line, self.column, self.message)
    }
}

fn error_at(text: &str, at: usize, message: String) -> SqlError {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    SqlError { line, column, message }
}

/// Where the `/* … */` comment at `start` ends. An optimizer hint (`/*+ RESOURCE_GROUP(g) */`)
/// is refused: it binds one query's work to a group, and here there is no query.
fn comment_end(text: &str, start: usize) -> Result<usize, SqlError> {
    if text.as_bytes().get(start + 2) == Some(&b'+') {
        return Err(error_at(text, start, HINT_INSTEAD.into()));
    }
    match text[start + 2..].find("*/") {
        Some(end) => Ok(start + end + 4),
        None => Err(error_at(text, start, "a comment `/*` is never closed by `*/`".into())),
    }
}

fn tokens(text: &str) -> Result<Vec<Token>, SqlError> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        match c {
            b' ' | b'\t' | b'\r' | b'\n' => i += 1,
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => i = comment_end(text, start)?,
            b'=' => {
                out.push(Token { kind: Kind::Equals, at: start });
                i += 1;
            }
            b',' => {
                out.push(Token { kind: Kind::Comma, at: start });
                i += 1;
            }
            b';' => {
                out.push(Token { kind: Kind::Semicolon, at: start });
                i += 1;
            }
            b'\'' | b'"' | b'`' => {
                let Some(len) = text[i + 1..].find(c as char) else {
                    return Err(error_at(
                        text,
                        start,
                        format!("a name opened by {} is never closed", c as char),
                    ));
                };
                out.push(Token { kind: Kind::Quoted(text[i + 1..i + 1 + len].to_string()), at: start });
                i += len + 2;
            }
            b'0'..=b'9' | b'.' => {
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || matches!(bytes[i], b'.' | b'_'))
                {
                    // An exponent's sign: 1e+6.
                    if matches!(bytes[i], b'e' | b'E') && matches!(bytes.get(i + 1), Some(b'+' | b'-')) {
                        i += 1;
                    }
                    i += 1;
                }
                out.push(Token { kind: Kind::Number(text[start..i].to_string()), at: start });
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric() || matches!(bytes[i], b'_' | b'-' | b'.'))
                {
                    i += 1;
                }
                out.push(Token { kind: Kind::Word(text[start..i].to_string()), at: start });
            }
            _ => {
                let ch = text[i..].chars().next().unwrap_or('?');
                out.push(Token { kind: Kind::Other(ch), at: start });
                i += ch.len_utf8();
            }
        }
    }
    Ok(out)
}

struct Parser<'a> {
    text: &'a str,
    tokens: Vec<Token>,
    next: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.next)
    }

    /// Where the next token starts, or the end of the text.
    fn here(&self) -> usize {
        self.peek().map_or(self.text.len(), |t| t.at)
    }

    fn describe(&self) -> String {
        match self.peek().map(|t| &t.kind) {
            None => "the end of the text".into(),
            Some(Kind::Word(w) | Kind::Number(w)) => format!("`{w}`"),
            Some(Kind::Quoted(q)) => format!("'{q}'"),
            Some(Kind::Equals) => "`=`".into(),
            Some(Kind::Comma) => "`,`".into(),
            Some(Kind::Semicolon) => "`;`".into(),
            Some(Kind::Other(c)) => format!("`{c}`"),
        }
    }

    fn fail<T>(&self, expected: &str) -> Result<T, SqlError> {
        Err(error_at(self.text, self.here(), format!("expected {expected}, found {}", self.describe())))
    }

    fn is_word(&self, word: &str) -> bool {
        matches!(self.peek().map(|t| &t.kind), Some(Kind::Word(w)) if w.eq_ignore_ascii_case(word))
    }

    fn eat_word(&mut self, word: &str) -> bool {
        let yes = self.is_word(word);
        if yes {
            self.next += 1;
        }
        yes
    }

    fn expect_word(&mut self, word: &str) -> Result<(), SqlError> {
        if self.eat_word(word) { Ok(()) } else { self.fail(&format!("`{word}`")) }
    }

    fn eat(&mut self, kind: &Kind) -> bool {
        let yes = self.peek().map(|t| &t.kind) == Some(kind);
        if yes {
            self.next += 1;
        }
        yes
    }

    fn name(&mut self) -> Result<String, SqlError> {
        match self.peek().map(|t| t.kind.clone()) {
            Some(Kind::Word(w) | Kind::Quoted(w)) => {
                self.next += 1;
                Ok(w)
            }
            _ => self.fail("a resource group name"),
        }
    }

    /// A user's name, and its host if given, which must be `'%'`.
    fn user(&mut self) -> Result<String, SqlError> {
        let name = match self.peek().map(|t| &t.kind) {
            Some(Kind::Word(w) | Kind::Quoted(w)) => w.clone(),
            _ => return self.fail("a user name"),
        };
        self.next += 1;
        if self.eat(&Kind::Other('@')) {
            let at = self.here();
            match self.peek().map(|t| &t.kind) {
                Some(Kind::Quoted(h)) if h == "%" => self.next += 1,
                _ => {
                    return Err(error_at(
                        self.text,
                        at,
                        "a user's host must be '%': a token is not tied to a host".into(),
                    ));
                }
            }
        }
        Ok(name)
    }

    /// `RESOURCE GROUP g`, if it comes next.
    fn resource_group(&mut self) -> Result<Option<String>, SqlError> {
        if !self.eat_word("RESOURCE") {
            return Ok(None);
        }
        self.expect_word("GROUP")?;
        self.eat(&Kind::Equals);
        Ok(Some(self.name()?))
    }

    fn user_statement(&mut self, verb: &str) -> Result<Statement, SqlError> {
        let if_clause = self.eat_word("IF");
        if if_clause {
            if verb == "CREATE" {
                self.expect_word("NOT")?;
            }
            self.expect_word("EXISTS")?;
        }
        let name = self.user()?;
        match verb {
            "CREATE" => {
                let group = self.resource_group()?;
                if self.is_word("IDENTIFIED") {
                    return Err(error_at(self.text, self.here(), PASSWORD_INSTEAD.into()));
                }
                Ok(Statement::CreateUser { name, if_not_exists: if_clause, group })
            }
            "ALTER" => match self.resource_group()? {
                Some(group) => Ok(Statement::AlterUser { name, group }),
                None => self.fail("RESOURCE GROUP: ALTER USER changes a user's resource group"),
            },
            _ => Ok(Statement::DropUser { name, if_exists: if_clause }),
        }
    }

    /// CREATE RESOURCE GROUP, after CREATE.
    fn create_group(&mut self) -> Result<Statement, SqlError> {
        if self.eat_word("RESOURCE") {
            self.expect_word("GROUP")?;
            let if_not_exists = self.eat_word("IF");
            if if_not_exists {
                self.expect_word("NOT")?;
                self.expect_word("EXISTS")?;
            }
            let name = self.name()?;
            let at = self.here();
            let options = self.options()?;
            if options.ru_per_sec.is_none() {
                return Err(error_at(
                    self.text,
                    at,
                    format!("RU_PER_SEC: CREATE RESOURCE GROUP {name} needs one, such as RU_PER_SEC = 1000"),
                ));
            }
            return Ok(Statement::Create { name, if_not_exists, options });
        }
        self.fail("`RESOURCE` or `USER` after CREATE")
    }

    /// ALTER RESOURCE GROUP, after ALTER.
    fn alter_group(&mut self) -> Result<Statement, SqlError> {
        self.expect_word("RESOURCE")?;
        self.expect_word("GROUP")?;
        let name = self.name()?;
        let at = self.here();
        let options = self.options()?;
        if options == Options::default() {
            return Err(error_at(
                self.text,
                at,
                "expected RU_PER_SEC, PRIORITY, BURSTABLE or PARENT: ALTER changes at least one".into(),
            ));
        }
        Ok(Statement::Alter { name, options })
    }

    fn statement(&mut self) -> Result<Statement, SqlError> {
        for verb in ["CREATE", "ALTER", "DROP"] {
            if self.is_word(verb)
                && self
                    .tokens
                    .get(self.next + 1)
                    .is_some_and(|t| matches!(&t.kind, Kind::Word(w) if w.eq_ignore_ascii_case("USER")))
            {
                self.next += 2;
                return self.user_statement(verb);
            }
        }
        if self.eat_word("CREATE") {
            return self.create_group();
        }
        if self.eat_word("ALTER") {
            return self.alter_group();
        }
        if self.eat_word("DROP") {
            self.expect_word("RESOURCE")?;
            self.expect_word("GROUP")?;
            let if_exists = self.eat_word("IF");
            if if_exists {
                self.expect_word("EXISTS")?;
            }
            return Ok(Statement::Drop { name: self.name()?, if_exists });
        }
        if self.eat_word("SHOW") {
            if self.eat_word("CREATE") {
                self.expect_word("RESOURCE")?;
                self.expect_word("GROUP")?;
                return Ok(Statement::ShowCreate { name: self.name()? });
            }
            self.expect_word("RESOURCE")?;
            self.expect_word("GROUPS")?;
            return Ok(Statement::ShowAll);
        }
        if self.eat_word("SET") {
            if self.is_word("RESOURCE") {
                return Err(error_at(self.text, self.here(), SESSION_INSTEAD.into()));
            }
            self.expect_word("GLOBAL")?;
            self.expect_word("TIDB_ENABLE_RESOURCE_CONTROL")?;
            self.eat(&Kind::Equals);
            let on = if self.eat_word("ON") || self.eat_word("TRUE") || self.eat_number("1") {
                true
            } else if self.eat_word("OFF") || self.eat_word("FALSE") || self.eat_number("0") {
                false
            } else {
                return self.fail("ON or OFF for tidb_enable_resource_control");
            };
            return Ok(Statement::SetThrottling { on });
        }
        self.fail("CREATE, ALTER, DROP, SHOW or SET")
    }

    /// Takes the number `n` written as it is.
    fn eat_number(&mut self, n: &str) -> bool {
        let here = matches!(self.peek().map(|t| &t.kind), Some(Kind::Number(w)) if w == n);
        self.next += usize::from(here);
        here
    }

    fn options(&mut self) -> Result<Options, SqlError> {
        let mut o = Options::default();
        loop {
            let at = self.here();
            let twice = |what: &str| Err(error_at(self.text, at, format!("{what}: given twice")));
            if self.eat_word("RU_PER_SEC") {
                if o.ru_per_sec.is_some() {
                    return twice("RU_PER_SEC");
                }
                self.eat(&Kind::Equals);
                o.ru_per_sec = Some(self.number("RU_PER_SEC")?);
            } else if self.eat_word("PRIORITY") {
                if o.priority.is_some() {
                    return twice("PRIORITY");
                }
                self.eat(&Kind::Equals);
                o.priority = Some(if self.eat_word("LOW") {
                    Priority::Low
                } else if self.eat_word("MEDIUM") {
                    Priority::Medium
                } else if self.eat_word("HIGH") {
                    Priority::High
                } else if let Some(Kind::Number(n)) = self.peek().map(|t| &t.kind)
                    && let Some(level) = n.parse::<u32>().ok().filter(|l| (1..=16).contains(l))
                {
                    self.next += 1;
                    Priority::Level(level)
                } else {
                    return self.fail("LOW, MEDIUM, HIGH or a level from 1 to 16 for PRIORITY");
                });
            } else if self.eat_word("BURSTABLE") {
                if o.burstable.is_some() {
                    return twice("BURSTABLE");
                }
                o.burstable = Some(if self.eat(&Kind::Equals) {
                    if self.eat_word("TRUE") || self.eat_word("ON") {
                        true
                    } else if self.eat_word("FALSE") || self.eat_word("OFF") {
                        false
                    } else {
                        return self.fail("TRUE or FALSE for BURSTABLE");
                    }
                } else {
                    true
                });
            } else if self.eat_word("PARENT") {
                if o.parent.is_some() {
                    return twice("PARENT");
                }
                self.eat(&Kind::Equals);
                o.parent = Some(if self.eat_word("NULL") { None } else { Some(self.name()?) });
            } else {
                match self.peek().map(|t| &t.kind) {
                    None | Some(Kind::Semicolon) => return Ok(o),
                    _ => return self.fail("RU_PER_SEC, PRIORITY, BURSTABLE, PARENT, `;` or the end"),
                }
            }
            self.eat(&Kind::Comma);
        }
    }

    fn number(&mut self, what: &str) -> Result<f64, SqlError> {
        let max = tollgate_model::settings::RATE_MAX;
        if let Some(Kind::Number(n)) = self.peek().map(|t| &t.kind)
            && let Some(v) = n.parse::<f64>().ok().filter(|v| (0.0..=max).contains(v))
        {
            self.next += 1;
            return Ok(v);
        }
        self.fail(&format!("a number from 0 to {max:e} for {what}"))
    }
}

/// Parses every statement of `text`; the first mistake stops it.
pub fn parse(text: &str) -> Result<Vec<Statement>, SqlError> {
    if text.len() > SQL_MAX_BYTES {
        return Err(SqlError {
            line: 1,
            column: 1,
            message: format!("the text is {} bytes; at most {SQL_MAX_BYTES} are taken", text.len()),
        });
    }
    let tokens = tokens(text)?;
    let mut p = Parser { text, tokens, next: 0 };
    let mut out = Vec::new();
    loop {
        while p.eat(&Kind::Semicolon) {}
        if p.peek().is_none() {
            break;
        }
        if out.len() == STATEMENTS_MAX {
            return p.fail(&format!("the end: at most {STATEMENTS_MAX} statements are taken"));
        }
        out.push(p.statement()?);
        if p.peek().is_some() && !p.eat(&Kind::Semicolon) {
            return p.fail("`;` between statements");
        }
    }
    if out.is_empty() {
        return Err(SqlError { line: 1, column: 1, message: "no statement given".into() });
    }
    Ok(out)
}

/// The patch a CREATE or ALTER sends. `current` is the group as it is (ALTER only).
fn patch(o: &Options, current: Option<&v1::GroupSettings>) -> v1::GroupPatch {
    let mut p = v1::GroupPatch { priority: o.priority.map(Priority::level), ..Default::default() };
    match &o.parent {
        Some(Some(parent)) => p.parent = Some(parent.clone()),
        Some(None) => p.clear_parent = true,
        None => {}
    }
    // Burstable as asked, or as the group already is.
    let burstable = o.burstable.unwrap_or_else(|| current.is_some_and(|c| c.limit.is_none()));
    let reserved = o.ru_per_sec.or(current.map(|c| c.reserved));
    if let Some(r) = o.ru_per_sec {
        p.reserved = Some(r);
    }
    if burstable {
        p.unlimited = o.burstable == Some(true);
    } else if o.ru_per_sec.is_some() || o.burstable == Some(false) {
        // Not burstable: the limit is the group's RU_PER_SEC.
        p.limit = reserved;
    }
    p
}

/// The statement that would create the group as it is.
fn create_text(name: &str, s: &v1::GroupSettings) -> String {
    let mut out = format!("CREATE RESOURCE GROUP `{name}` RU_PER_SEC = {}", admin::fmt_units(s.reserved));
    let _ = write!(out, ", PRIORITY = {}", admin::priority_name(s.priority).to_uppercase());
    match s.limit {
        None => out.push_str(", BURSTABLE"),
        Some(l) if l != s.reserved => {
            let _ = write!(out, " /* limit {}: set with `tollgate group alter` */", admin::fmt_units(l));
        }
        Some(_) => {}
    }
    if let Some(parent) = &s.parent {
        let _ = write!(out, ", PARENT = `{parent}`");
    }
    out
}

/// Runs `text`'s statements in order; stops at the first that fails, saying which.
pub async fn run(target: &Target, text: &str) -> anyhow::Result<()> {
    let statements = match parse(text) {
        Ok(s) => s,
        Err(e) => bail!("{e}; nothing was run"),
    };
    let mut client = admin::connect(target).await?;
    let total = statements.len();
    for (i, statement) in statements.into_iter().enumerate() {
        if let Err(e) = execute(&mut client, statement).await {
            let done =
                if i == 0 { "none ran before it".to_string() } else { format!("the {i} before it ran") };
            bail!("statement {} of {total}: {e:#} ({done})", i + 1);
        }
    }
    Ok(())
}

async fn execute(client: &mut crate::admin::Admin, statement: Statement) -> anyhow::Result<()> {
    match statement {
        Statement::Create { name, if_not_exists, options } => {
            let req = v1::PutGroupRequest {
                name: name.clone(),
                patch: Some(patch(&options, None)),
                mode: v1::PutMode::Create as i32,
            };
            match client.put_group(req).await {
                Ok(_) => say(format!("created resource group {name}")),
                Err(s) if if_not_exists && s.code() == tonic::Code::AlreadyExists => {
                    say(format!("resource group {name} exists: left as it is"));
                }
                Err(s) => return Err(admin::rpc(s)),
            }
        }
        Statement::Alter { name, options } => {
            let Some(current) = admin::get(client, &name).await? else {
                bail!("group {name:?} does not exist");
            };
            let req = v1::PutGroupRequest {
                name: name.clone(),
                patch: Some(patch(&options, Some(&current))),
                mode: v1::PutMode::Alter as i32,
            };
            client.put_group(req).await.map_err(admin::rpc)?;
            say(format!("altered resource group {name}"));
        }
        Statement::Drop { name, if_exists } => {
            let answer = client
                .drop_group(v1::DropGroupRequest { name: name.clone(), if_exists })
                .await
                .map_err(admin::rpc)?
                .into_inner();
            if answer.existed {
                say(format!("dropped resource group {name}"));
            } else {
                say(format!("resource group {name} does not exist: nothing dropped"));
            }
        }
        Statement::ShowAll => show_all(client).await?,
        Statement::ShowCreate { name } => {
            let Some(current) = admin::get(client, &name).await? else {
                bail!("group {name:?} does not exist");
            };
            say(create_text(&name, &current));
        }
        Statement::CreateUser { .. } | Statement::AlterUser { .. } | Statement::DropUser { .. } => {
            return execute_user(client, statement).await;
        }
        Statement::SetThrottling { on } => {
            client.set_throttling(v1::SetThrottlingRequest { on }).await.map_err(admin::rpc)?;
            say(format!("resource control {}", if on { "on" } else { "off: nothing is throttled" }));
        }
    }
    Ok(())
}

/// SHOW RESOURCE GROUPS: every group, in TiDB's columns.
async fn show_all(client: &mut crate::admin::Admin) -> anyhow::Result<()> {
    let groups = admin::list_all(client).await?;
    say(format!("{:<24} {:>12} {:>8} {:>9} {:>12}", "NAME", "RU_PER_SEC", "PRIORITY", "BURSTABLE", "LIMIT"));
    for g in groups {
        let s = g.settings.unwrap_or_default();
        say(format!(
            "{:<24} {:>12} {:>8} {:>9} {:>12}",
            g.name,
            admin::fmt_units(s.reserved),
            admin::priority_name(s.priority).to_uppercase(),
            if s.limit.is_none() { "YES" } else { "NO" },
            s.limit.map_or("UNLIMITED".into(), admin::fmt_units),
        ));
    }
    Ok(())
}

/// The client tokens named `name`: a user's.
async fn user_tokens(client: &mut crate::admin::Admin, name: &str) -> anyhow::Result<Vec<v1::TokenInfo>> {
    let all = client.list_tokens(v1::ListTokensRequest {}).await.map_err(admin::rpc)?.into_inner().tokens;
    Ok(all.into_iter().filter(|t| t.role == "client" && t.name == name).collect())
}

/// CREATE, ALTER and DROP USER, on client tokens named after the user.
async fn execute_user(client: &mut crate::admin::Admin, statement: Statement) -> anyhow::Result<()> {
    match statement {
        Statement::CreateUser { name, if_not_exists, group } => {
            if !user_tokens(client, &name).await?.is_empty() {
                if if_not_exists {
                    say(format!("user {name} exists: left as it is"));
                    return Ok(());
                }
                bail!("user {name:?} exists (a client token of that name)");
            }
            let default_group = group.unwrap_or_default();
            let request = v1::CreateTokenRequest {
                role: "client".into(),
                name: name.clone(),
                default_group: default_group.clone(),
                ..v1::CreateTokenRequest::default()
            };
            let made = client.create_token(request).await.map_err(admin::rpc)?.into_inner();
            let bound = if default_group.is_empty() {
                String::new()
            } else {
                format!(", resource group {default_group}")
            };
            say(format!("created user {name}{bound}; its token, shown this once:"));
            say(made.token);
        }
        Statement::AlterUser { name, group } => {
            let tokens = user_tokens(client, &name).await?;
            let [token] = tokens.as_slice() else {
                if tokens.is_empty() {
                    bail!("user {name:?} does not exist");
                }
                let ids: Vec<&str> = tokens.iter().map(|t| t.id.as_str()).collect();
                bail!(
                    "user {name:?} has {} tokens ({}): set each with `tollgate token set-group`",
                    ids.len(),
                    ids.join(", ")
                );
            };
            let request = v1::SetTokenGroupRequest { id: token.id.clone(), default_group: group.clone() };
            client.set_token_group(request).await.map_err(admin::rpc)?;
            say(format!("altered user {name}: resource group {group}"));
        }
        Statement::DropUser { name, if_exists } => {
            let tokens = user_tokens(client, &name).await?;
            if tokens.is_empty() {
                if if_exists {
                    say(format!("user {name} does not exist: nothing dropped"));
                    return Ok(());
                }
                bail!("user {name:?} does not exist");
            }
            for t in tokens {
                client.revoke_token(v1::RevokeTokenRequest { id: t.id }).await.map_err(admin::rpc)?;
            }
            say(format!("dropped user {name}"));
        }
        _ => unreachable!("only user statements come here"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(ru: Option<f64>, priority: Option<Priority>, burstable: Option<bool>) -> Options {
        Options { ru_per_sec: ru, priority, burstable, parent: None }
    }

    #[test]
    fn the_designs_own_statements_parse() {
        let text = "CREATE RESOURCE GROUP oltp_applicaton RU_PER_SEC=20000, PRIORITY=HIGH, burstable;\n\
                    CREATE RESOURCE GROUP small_applicatoin RU_PER_SEC=5000;\n\
                    create resource group olap_application RU_PER_SEC = 50000 PRIORITY=LOW, BURSTABLE";
        let s = parse(text).unwrap();
        assert_eq!(
            s,
            vec![
                Statement::Create {
                    name: "oltp_applicaton".into(),
                    if_not_exists: false,
                    options: opts(Some(20000.0), Some(Priority::High), Some(true)),
                },
                Statement::Create {
                    name: "small_applicatoin".into(),
                    if_not_exists: false,
                    options: opts(Some(5000.0), None, None),
                },
                Statement::Create {
                    name: "olap_application".into(),
                    if_not_exists: false,
                    options: opts(Some(50000.0), Some(Priority::Low), Some(true)),
                },
            ]
        );
    }

    #[test]
    fn alter_drop_show_and_comments_parse() {
        let text = "/* tune */ ALTER RESOURCE GROUP `a b` PRIORITY MEDIUM BURSTABLE = false; -- done\n\
                    DROP RESOURCE GROUP IF EXISTS x;; SHOW RESOURCE GROUPS; show create resource group 'y'";
        assert_eq!(
            parse(text).unwrap(),
            vec![
                Statement::Alter {
                    name: "a b".into(),
                    options: opts(None, Some(Priority::Medium), Some(false))
                },
                Statement::Drop { name: "x".into(), if_exists: true },
                Statement::ShowAll,
                Statement::ShowCreate { name: "y".into() },
            ]
        );
        assert_eq!(
            parse("SET GLOBAL tidb_enable_resource_control = OFF; set global TIDB_ENABLE_RESOURCE_CONTROL 1")
                .unwrap(),
            vec![Statement::SetThrottling { on: false }, Statement::SetThrottling { on: true }]
        );
        assert_eq!(
            parse(
                "CREATE USER IF NOT EXISTS 'app'@'%' RESOURCE GROUP rg1; create user ops; \
                 ALTER USER app RESOURCE GROUP = rg2; DROP USER IF EXISTS `app`"
            )
            .unwrap(),
            vec![
                Statement::CreateUser { name: "app".into(), if_not_exists: true, group: Some("rg1".into()) },
                Statement::CreateUser { name: "ops".into(), if_not_exists: false, group: None },
                Statement::AlterUser { name: "app".into(), group: "rg2".into() },
                Statement::DropUser { name: "app".into(), if_exists: true },
            ]
        );
        let e = |t: &str| parse(t).unwrap_err().to_string();
        assert_eq!(
            e("ALTER USER app"),
            "line 1, column 15: expected RESOURCE GROUP: ALTER USER changes a user's resource group, found the end of the text"
        );
        assert!(
            e("CREATE USER app IDENTIFIED BY 'pw'")
                .starts_with("line 1, column 17: a user has no password here")
        );
        // TiDB's bindings of work to a group, each refused with what does it here.
        assert!(
            e("SET RESOURCE GROUP rg1").starts_with("line 1, column 5: SET RESOURCE GROUP binds a session")
        );
        assert!(e("SET RESOURCE GROUP rg1").contains("ALTER USER name RESOURCE GROUP g"));
        let hint =
            e("SHOW RESOURCE GROUPS;\nCREATE /*+ RESOURCE_GROUP(rg1) */ RESOURCE GROUP g RU_PER_SEC = 5");
        assert!(hint.starts_with("line 2, column 8: an optimizer hint"), "{hint}");
        assert!(hint.contains("the `group` of /v1/check"), "{hint}");
        assert!(e("CREATE USER 'app'@'localhost'").contains("a user's host must be '%'"));
    }

    #[test]
    fn errors_point_at_the_offending_token() {
        let e = |t: &str| parse(t).unwrap_err().to_string();
        assert_eq!(
            e("CREATE RESOURCE GROUP g RU_PER_SEC = lots"),
            "line 1, column 38: expected a number from 0 to 1e15 for RU_PER_SEC, found `lots`"
        );
        assert_eq!(
            e("CREATE RESOURCE GROUP g RU_PER_SEC=1;\nALTER RESOURCE GROUP g PRIORITY = URGENT"),
            "line 2, column 35: expected LOW, MEDIUM, HIGH or a level from 1 to 16 for PRIORITY, found `URGENT`"
        );
        assert_eq!(
            e("CREATE RESOURCE GROUP g PRIORITY=LOW"),
            "line 1, column 25: RU_PER_SEC: CREATE RESOURCE GROUP g needs one, such as RU_PER_SEC = 1000"
        );
        assert_eq!(
            e("CREATE RESOURCE GROUP g RU_PER_SEC=1 RU_PER_SEC=2"),
            "line 1, column 38: RU_PER_SEC: given twice"
        );
        assert_eq!(
            e("CREATE RESOURCE GROUP g RU_PER_SEC=1 QUERY_LIMIT=(EXEC_ELAPSED='1s')"),
            "line 1, column 38: expected RU_PER_SEC, PRIORITY, BURSTABLE, PARENT, `;` or the end, found `QUERY_LIMIT`"
        );
        assert_eq!(
            e("DELETE FROM t"),
            "line 1, column 1: expected CREATE, ALTER, DROP, SHOW or SET, found `DELETE`"
        );
        assert_eq!(
            e("SET GLOBAL tidb_enable_resource_control = maybe"),
            "line 1, column 43: expected ON or OFF for tidb_enable_resource_control, found `maybe`"
        );
        assert_eq!(
            e("ALTER RESOURCE GROUP g"),
            "line 1, column 23: expected RU_PER_SEC, PRIORITY, BURSTABLE or PARENT: ALTER changes at least one"
        );
        assert_eq!(
            e("DROP RESOURCE GROUP"),
            "line 1, column 20: expected a resource group name, found the end of the text"
        );
        assert_eq!(
            e("SHOW RESOURCE GROUPS x"),
            "line 1, column 22: expected `;` between statements, found `x`"
        );
        assert_eq!(
            e("CREATE RESOURCE GROUP g RU_PER_SEC=-1"),
            "line 1, column 36: expected a number from 0 to 1e15 for RU_PER_SEC, found `-`"
        );
        assert_eq!(
            e("CREATE RESOURCE GROUP g RU_PER_SEC=1e16"),
            "line 1, column 36: expected a number from 0 to 1e15 for RU_PER_SEC, found `1e16`"
        );
        assert_eq!(e(" ; "), "line 1, column 1: no statement given");
        assert_eq!(e("/* open"), "line 1, column 1: a comment `/*` is never closed by `*/`");
        assert_eq!(e("DROP RESOURCE GROUP 'x"), "line 1, column 21: a name opened by ' is never closed");
    }

    #[test]
    fn patches_follow_tidbs_reading() {
        let burstable = v1::GroupSettings { reserved: 10.0, limit: None, ..Default::default() };
        let capped = v1::GroupSettings { reserved: 10.0, limit: Some(10.0), ..Default::default() };
        // CREATE: RU_PER_SEC is reserved and limit; BURSTABLE lifts the limit.
        let p = patch(&opts(Some(5.0), None, None), None);
        assert_eq!((p.reserved, p.limit, p.unlimited), (Some(5.0), Some(5.0), false));
        let p = patch(&opts(Some(5.0), Some(Priority::High), Some(true)), None);
        assert_eq!((p.reserved, p.limit, p.unlimited, p.priority), (Some(5.0), None, true, Some(16)));
        // ALTER keeps a group burstable unless told otherwise.
        let p = patch(&opts(Some(20.0), None, None), Some(&burstable));
        assert_eq!((p.reserved, p.limit, p.unlimited), (Some(20.0), None, false));
        let p = patch(&opts(Some(20.0), None, None), Some(&capped));
        assert_eq!((p.reserved, p.limit), (Some(20.0), Some(20.0)));
        // BURSTABLE = FALSE caps it at its RU_PER_SEC.
        let p = patch(&opts(None, None, Some(false)), Some(&burstable));
        assert_eq!((p.reserved, p.limit, p.unlimited), (None, Some(10.0), false));
        let p = patch(&opts(None, None, Some(true)), Some(&capped));
        assert_eq!((p.limit, p.unlimited), (None, true));
    }

    #[test]
    fn show_create_reads_back_as_the_same_group() {
        let s = v1::GroupSettings { reserved: 500.0, limit: None, priority: 16, ..Default::default() };
        let text = create_text("oltp", &s);
        assert_eq!(text, "CREATE RESOURCE GROUP `oltp` RU_PER_SEC = 500, PRIORITY = HIGH, BURSTABLE");
        assert_eq!(
            parse(&text).unwrap(),
            vec![Statement::Create {
                name: "oltp".into(),
                if_not_exists: false,
                options: opts(Some(500.0), Some(Priority::High), Some(true)),
            }]
        );
    }
}
