//! `-o text|json|yaml` of the listing commands (`status`, `services`, `conntrack`,
//! `policy`): text for people, the agent's answer whole as JSON or YAML for programs.

use anyhow::Result;
use serde::Serialize;

/// An output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Tables and lines for people.
    #[default]
    Text,
    /// The agent's answer as JSON (indented).
    Json,
    /// The same as YAML.
    Yaml,
}

/// The output options of a listing command.
#[derive(clap::Args, Clone, Debug)]
pub struct Output {
    /// Output format: text, json or yaml.
    #[arg(
        short = 'o',
        long = "output",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub output: Format,
    /// The same as -o json.
    #[arg(long, conflicts_with = "output", global = true)]
    pub json: bool,
}

impl Output {
    /// The format asked for.
    pub fn format(&self) -> Format {
        if self.json { Format::Json } else { self.output }
    }

    /// Prints `value` in the format asked for: `text` makes the text.
    pub fn print<T: Serialize>(&self, value: &T, text: impl FnOnce() -> String) -> Result<()> {
        print!("{}", self.render(value, text)?);
        Ok(())
    }

    /// What [`Output::print`] prints.
    pub fn render<T: Serialize>(&self, value: &T, text: impl FnOnce() -> String) -> Result<String> {
        Ok(match self.format() {
            Format::Text => text(),
            Format::Json => serde_json::to_string_pretty(value)? + "\n",
            Format::Yaml => serde_saphyr::to_string(value)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        out: Output,
    }

    fn parse(args: &[&str]) -> Result<Output, clap::Error> {
        let mut argv = vec!["ferry"];
        argv.extend_from_slice(args);
        <Cli as clap::Parser>::try_parse_from(argv).map(|c| c.out)
    }

    #[test]
    fn each_format_renders_the_same_answer() {
        let v = serde_json::json!({"ports": [{"name": "uplink", "rx": 3}]});
        let text = || "uplink 3\n".to_string();
        let r = |args: &[&str]| parse(args).unwrap().render(&v, text).unwrap();
        assert_eq!(r(&[]), "uplink 3\n");
        assert_eq!(
            r(&["-o", "json"]),
            serde_json::to_string_pretty(&v).unwrap() + "\n"
        );
        assert_eq!(r(&["--json"]), r(&["-o", "json"]));
        let yaml = r(&["--output", "yaml"]);
        let back: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(back, v, "{yaml}");
        assert!(parse(&["-o", "xml"]).is_err());
        assert!(
            parse(&["-o", "yaml", "--json"]).is_err(),
            "two formats at once"
        );
    }
}
