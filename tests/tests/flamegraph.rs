//! Flame graphs for people without Go: `snapshot --flamegraph` and `profiler flamegraph`
//! draw a profile's own shares. The SVG is checked as inferno writes it: every frame is a
//! `<g>` whose `<title>` is `name (N samples, P%)`, and P is the frame's width. And as a
//! person looks at it: headless Chromium opens the SVG, and the screenshot shows flames.

use std::process::Command;
use std::time::Duration;

use profiler_tests::run::run_with_timeout;
use profiler_tests::{assert_success, expect, preflight, run_profiler};
use profiler_tests::{Fixture, FixtureKind, Profile, TempDir};

const CAPTURE_S: &str = "3s";
/// Longer than the capture plus the profiler's start.
const FIXTURE_S: u32 = 10;
/// The SVG states shares to 0.01%; a frame inferno draws is the profile's own share, so
/// the two agree to rounding. 1 point leaves room for nothing but a wrong drawing.
const WIDTH_TOLERANCE: f64 = 0.01;

/// Ground truth: the profile the same snapshot wrote. cpu_split's hot_a and hot_b are drawn
/// at their shares of the profile's CPU time (the default sample type), next to
/// `cpu.pb.gz` as `cpu.svg`; `profiler flamegraph` draws the same from the file, for a
/// chosen sample type too, and names the types a wrong one could have been.
#[test]
fn flame_graphs_draw_the_profiles_shares() {
    if !preflight() {
        return;
    }
    let out = TempDir::new("flame");
    let fixture = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let (pid, out_arg) = (fixture.pid().to_string(), out.path_arg());
    let args = ["snapshot", "--pid", &pid, "--duration", CAPTURE_S, "--output", &out_arg, "--flamegraph"];
    assert_success(&run_profiler(&args), "snapshot --flamegraph");
    let file = expect::profile_written(out.path(), fixture.comm(), fixture.pid());
    let profile = Profile::decode(&file);
    let svg_file = file.with_file_name("cpu.svg");
    let svg = std::fs::read_to_string(&svg_file).unwrap_or_else(|e| panic!("{}: {e}", svg_file.display()));
    assert!(svg.starts_with("<?xml") && svg.contains("<svg"), "{} is no SVG", svg_file.display());
    for function in ["hot_a", "hot_b", "work_loop"] {
        let drawn = width(&svg, function);
        let share = profile.fraction_containing("cpu", function);
        assert!(
            (drawn - share).abs() <= WIDTH_TOLERANCE,
            "{function}: drawn at {drawn:.4} of the width, {share:.4} of the profile's CPU time"
        );
    }

    let by_hand = out.path().join("samples.svg");
    let output = run_profiler(&[
        "flamegraph",
        &file.display().to_string(),
        "--sample-index",
        "samples",
        "-o",
        &by_hand.display().to_string(),
    ]);
    assert_success(&output, "profiler flamegraph");
    let svg = std::fs::read_to_string(&by_hand).unwrap();
    let share = profile.fraction_containing("samples", "hot_a");
    assert!((width(&svg, "hot_a") - share).abs() <= WIDTH_TOLERANCE, "samples: hot_a drawn off its share {share:.4}");

    let output = run_profiler(&["flamegraph", &file.display().to_string(), "--sample-index", "alloc_space"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "a sample type the profile lacks was drawn");
    assert!(stderr.contains("no sample type \"alloc_space\"") && stderr.contains("samples, cpu"), "{stderr}");
}

/// A person opens `cpu.svg` in a browser. Headless Chromium (Debian's `chromium`) renders
/// cpu_split's flame graph to a PNG, which must not be blank: a good part of it in the warm
/// colours inferno draws frames with (red to yellow, never the background's pale yellow or
/// white), and at least one row of frames (`all`, the root) across nearly the whole width.
#[test]
fn a_flame_graph_renders_in_a_browser() {
    if !preflight() {
        return;
    }
    let out = TempDir::new("flame-browser");
    let fixture = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let (pid, out_arg) = (fixture.pid().to_string(), out.path_arg());
    let args = ["snapshot", "--pid", &pid, "--duration", CAPTURE_S, "--output", &out_arg, "--flamegraph"];
    assert_success(&run_profiler(&args), "snapshot --flamegraph");
    let svg = expect::profile_written(out.path(), fixture.comm(), fixture.pid()).with_file_name("cpu.svg");
    let png = out.path().join("cpu.png");
    let mut chromium = Command::new("chromium");
    chromium
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,800"])
        .arg(format!("--user-data-dir={}", out.path().join("chromium").display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", svg.display()));
    let output = run_with_timeout(&mut chromium, Duration::from_secs(120));
    assert!(png.is_file(), "chromium wrote no screenshot: {}", String::from_utf8_lossy(&output.stderr));

    let (width, height, rgb) = decode_png(&png);
    let warm = |p: &[u8]| p[0] >= 200 && p[2] <= 60 && p[1] <= 235;
    let pixels: Vec<&[u8]> = rgb.chunks(3).collect();
    let share = pixels.iter().filter(|p| warm(p)).count() as f64 / pixels.len() as f64;
    assert!(share >= 0.03, "{}: only {:.1}% of the screenshot is drawn in frame colours", png.display(), share * 100.0);
    let widest =
        (0..height).map(|y| pixels[y * width..(y + 1) * width].iter().filter(|p| warm(p)).count()).max().unwrap_or(0);
    assert!(
        widest as f64 >= 0.9 * width as f64,
        "{}: no row of frames spans the width ({widest} of {width} px)",
        png.display()
    );
}

/// A PNG's width, height and pixels as RGB.
fn decode_png(path: &std::path::Path) -> (usize, usize, Vec<u8>) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().expect("a PNG header");
    let mut buf = vec![0; reader.output_buffer_size().expect("a sane PNG size")];
    let info = reader.next_frame(&mut buf).expect("a PNG frame");
    let channels = info.color_type.samples();
    // Grey (with or without alpha) repeats its one value; colour keeps its first three.
    let rgb = buf[..info.buffer_size()]
        .chunks(channels)
        .flat_map(|p| if channels >= 3 { [p[0], p[1], p[2]] } else { [p[0]; 3] })
        .collect();
    (info.width as usize, info.height as usize, rgb)
}

/// The summed width, as a fraction, of the frames named `function` (at any depth).
fn width(svg: &str, function: &str) -> f64 {
    let titles = svg.split("<title>").skip(1).filter_map(|t| t.split("</title>").next());
    let percents: Vec<f64> = titles
        .filter(|t| t.starts_with(&format!("{function} (")))
        .filter_map(|t| t.rsplit(", ").next()?.strip_suffix("%)")?.parse::<f64>().ok())
        .collect();
    assert!(!percents.is_empty(), "no frame {function} in the SVG");
    percents.iter().sum::<f64>() / 100.0
}
