// SPDX-License-Identifier: BSL-1.0
// tools/svg.cpp — stacked-bar charts of per-rank memory (`--svg FILE` on `plan` and `sweep`).
//
// One bar per configuration, one colour per category (weights, gradients, master weights,
// optimizer states, activations, temporaries, communication buffers, reserve), the device's limit
// as a dashed line (and its capacity when a memory cap lowers the limit), a legend, GiB on the
// axis. The document is self-contained SVG 1.1 (no scripts, no external fonts or styles), so
// browsers and image viewers open it as it is.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "planner.hpp"

namespace memalg::cli {

namespace {

constexpr const char* category_colors[category_count] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                                         "#59a14f", "#edc948", "#b07aa1", "#9c755f"};

std::string escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // XML 1.0 allows no control characters but tab, newline and carriage return.
        if (static_cast<unsigned char>(c) < 0x20) out += ' ';
        else out += c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

/// A "nice" axis step (1, 2 or 5 × 10^k GiB) giving about five ticks up to `top`.
double nice_step(double top) {
  const double raw = top / 5;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * magnitude) return m * magnitude;
  return 10 * magnitude;
}

}  // namespace

std::string parameter_count_text(std::uint64_t n) {
  const double v = static_cast<double>(n);
  char buf[32];
  if (v >= 1e12) std::snprintf(buf, sizeof buf, "%.2fT", v / 1e12);
  else if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2fB", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(n));
  return buf;
}

std::string render_svg(const chart& c) {
  if (c.bars.empty()) throw usage_error("nothing to chart: no configuration to draw");
  if (c.bars.size() > max_chart_bars)
    throw usage_error("cannot chart " + std::to_string(c.bars.size()) + " configurations: at most " +
                      std::to_string(max_chart_bars) + " (use --top)");
  if (c.capacity.value == 0 || c.limit.value == 0) throw usage_error("cannot chart against a device without capacity");

  constexpr double gib = 1073741824.0;
  double highest = static_cast<double>(c.capacity.value) / gib;
  for (const chart_bar& b : c.bars) highest = std::max(highest, static_cast<double>(b.bytes.total().value) / gib);
  const double step = nice_step(highest);
  const double top = std::ceil(highest / step) * step;

  // Layout (px): plot area left 70, top 70; bars 36 wide on a 56 px pitch, numbered below; the
  // configurations are listed under the chart, one per line.
  const double bar_w = 36, pitch = 56, left = 70, plot_top = 70, plot_h = 320, legend_w = 190;
  std::size_t longest = 0;
  for (const chart_bar& b : c.bars) longest = std::max(longest, b.label.size());
  const double key_w = 40 + 6.6 * static_cast<double>(longest + 24);
  const double plot_w = std::max(360.0, pitch * static_cast<double>(c.bars.size()) + 20);
  const double key_top = plot_top + plot_h + 44;
  const double width = std::max(left + plot_w + legend_w, left + key_w);
  const double height = key_top + 16 * static_cast<double>(c.bars.size()) + 16;
  const auto y_of = [&](double g) { return plot_top + plot_h - g / top * plot_h; };

  std::ostringstream s;
  s << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" << num(width) << "\" height=\""
    << num(height) << "\" viewBox=\"0 0 " << num(width) << " " << num(height)
    << "\" font-family=\"DejaVu Sans, Arial, sans-serif\" font-size=\"12\">\n"
    << "<title>" << escape(c.title) << "</title>\n"
    << "<rect x=\"0\" y=\"0\" width=\"" << num(width) << "\" height=\"" << num(height) << "\" fill=\"#ffffff\"/>\n"
    << "<text x=\"" << num(left) << "\" y=\"26\" font-size=\"16\" font-weight=\"bold\">" << escape(c.title)
    << "</text>\n"
    << "<text x=\"" << num(left) << "\" y=\"46\" fill=\"#555555\">" << escape(c.subtitle) << "</text>\n";

  // Axis and grid.
  for (double g = 0; g <= top + step / 2; g += step) {
    const double y = y_of(g);
    s << "<line x1=\"" << num(left) << "\" y1=\"" << num(y) << "\" x2=\"" << num(left + plot_w) << "\" y2=\"" << num(y)
      << "\" stroke=\"#dddddd\"/>\n"
      << "<text x=\"" << num(left - 6) << "\" y=\"" << num(y + 4) << "\" text-anchor=\"end\">" << num(g) << "</text>\n";
  }
  s << "<text x=\"16\" y=\"" << num(plot_top + plot_h / 2) << "\" transform=\"rotate(-90 16 "
    << num(plot_top + plot_h / 2) << ")\" text-anchor=\"middle\">GiB per rank</text>\n"
    << "<line x1=\"" << num(left) << "\" y1=\"" << num(plot_top) << "\" x2=\"" << num(left) << "\" y2=\""
    << num(plot_top + plot_h) << "\" stroke=\"#333333\"/>\n"
    << "<line x1=\"" << num(left) << "\" y1=\"" << num(plot_top + plot_h) << "\" x2=\"" << num(left + plot_w)
    << "\" y2=\"" << num(plot_top + plot_h) << "\" stroke=\"#333333\"/>\n";

  const auto name_of = [&](std::size_t k) {
    return c.names.size() == category_count ? c.names[k] : std::string(category_name(category(k)));
  };
  // Bars, stacked bottom-up in category order.
  for (std::size_t i = 0; i < c.bars.size(); ++i) {
    const chart_bar& b = c.bars[i];
    const double x = left + 20 + pitch * static_cast<double>(i);
    double base = 0;
    s << "<g>\n<title>" << escape(b.label) << ": " << escape(to_string(b.bytes.total(), byte_unit::GiB))
      << (b.fits ? " (fits)" : " (does not fit)") << "</title>\n";
    for (std::size_t k = 0; k < category_count; ++k) {
      const double g = static_cast<double>(b.bytes[category(k)].value) / gib;
      if (g <= 0) continue;
      s << "<rect x=\"" << num(x) << "\" y=\"" << num(y_of(base + g)) << "\" width=\"" << num(bar_w) << "\" height=\""
        << num(y_of(base) - y_of(base + g)) << "\" fill=\"" << category_colors[k] << "\"><title>"
        << escape(name_of(k)) << ": " << escape(to_string(b.bytes[category(k)], byte_unit::GiB))
        << "</title></rect>\n";
      base += g;
    }
    s << "</g>\n";
    std::string number = "#";  // (appended: g++ 12 -O3 gives a bogus -Wrestrict on "#" + std::string&&, GCC PRs 105329, 105651)
    number += std::to_string(i + 1);
    s << "<text x=\"" << num(x + bar_w / 2) << "\" y=\"" << num(plot_top + plot_h + 16)
      << "\" text-anchor=\"middle\" font-size=\"11\"" << (b.fits ? "" : " fill=\"#b00020\"") << ">" << number
      << "</text>\n";
    s << "<text x=\"" << num(left) << "\" y=\"" << num(key_top + 16 * static_cast<double>(i))
      << "\" font-family=\"DejaVu Sans Mono, monospace\" font-size=\"11\"" << (b.fits ? "" : " fill=\"#b00020\"")
      << ">" << escape(number) << "  " << escape(b.label) << "  " << escape(to_string(b.bytes.total(), byte_unit::GiB))
      << (b.fits ? "" : " (does not fit)") << "</text>\n";
  }

  // The device's limit (and capacity when a cap lowers it).
  const auto line = [&](bytes at, const char* color, const std::string& label) {
    const double y = y_of(static_cast<double>(at.value) / gib);
    s << "<line x1=\"" << num(left) << "\" y1=\"" << num(y) << "\" x2=\"" << num(left + plot_w) << "\" y2=\"" << num(y)
      << "\" stroke=\"" << color << "\" stroke-width=\"2\" stroke-dasharray=\"6 4\"/>\n"
      << "<text x=\"" << num(left + plot_w - 4) << "\" y=\"" << num(y - 5) << "\" text-anchor=\"end\" fill=\"" << color
      << "\">" << escape(label) << "</text>\n";
  };
  if (c.limit.value < c.capacity.value) line(c.capacity, "#777777", c.device + " capacity " + to_string(c.capacity, byte_unit::GiB));
  line(c.limit, "#b00020", c.device + (c.limit.value < c.capacity.value ? " limit " : " capacity ") +
                               to_string(c.limit, byte_unit::GiB));

  // Legend.
  const double lx = left + plot_w + 20;
  for (std::size_t k = 0, shown = 0; k < category_count; ++k) {
    if (name_of(k).empty()) continue;
    const double y = plot_top + 20 * static_cast<double>(category_count - 1 - shown++);
    s << "<rect x=\"" << num(lx) << "\" y=\"" << num(y) << "\" width=\"12\" height=\"12\" fill=\"" << category_colors[k]
      << "\"/>\n<text x=\"" << num(lx + 18) << "\" y=\"" << num(y + 10) << "\">" << escape(name_of(k))
      << "</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

void write_output_file(const std::string& path, const std::string& text, std::string_view flag) {
  if (path.empty()) throw usage_error(std::string(flag) + " needs a file name, not an empty one");
  const std::string where = std::string(flag) + " '" + path + "'";
  struct stat st{};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw usage_error("cannot write " + where + ": it is a directory");
    if (S_ISLNK(st.st_mode))
      throw usage_error("will not write " + where + ": it is a symbolic link (name the file it points to, or a new path)");
    if (!S_ISREG(st.st_mode))
      throw usage_error("will not write " + where + ": it is not a regular file (a pipe, socket or device); name a file or a new path");
  } else if (errno != ENOENT) {
    throw usage_error("cannot write " + where + ": " + std::strerror(errno));
  }
  // A new file of our own beside the target (O_EXCL: never one that exists), renamed into place,
  // so a failure leaves no broken file and nothing but `path` is replaced.
  std::string temporary = path + ".XXXXXX";
  const int fd = ::mkstemp(temporary.data());
  if (fd < 0) throw usage_error("cannot write " + where + ": the directory does not exist or is not writable");
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::fchmod(fd, 0666 & ~mask);
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  const bool ok = done == text.size() && ::close(fd) == 0;
  if (!ok) {
    ::unlink(temporary.c_str());
    throw usage_error("cannot write " + where + ": the write failed");
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(temporary.c_str());
    throw usage_error("cannot write " + where + ": " + std::strerror(e));
  }
}

void write_svg(const chart& c, const std::string& path) {
  if (path.empty()) throw usage_error("--svg needs a file name, not an empty one");
  write_output_file(path, render_svg(c), "--svg");  // renders first: a chart that cannot be drawn writes nothing
}

chart plan_chart(const plan_inputs& in, const plan_result& r) {
  chart c{};
  c.title = "memalg plan: ";
  if (!in.model.name.empty()) c.title += std::string(in.model.name) + ", ";
  c.title += parameter_count_text(r.parameters) + " parameters";
  c.subtitle = "most loaded rank (stage " + std::to_string(r.most_loaded_stage) + ", peak at " +
               std::string(phase_name(r.peak_phase)) + ") on " + std::string(in.device.name);
  c.device = std::string(in.device.name);
  c.capacity = in.device.capacity;
  c.limit = r.limit;
  std::string label = "dp=" + std::to_string(in.mesh.dp) + " zero=" + std::to_string(in.mesh.zero_stage) +
                      " tp=" + std::to_string(in.mesh.tp) + " pp=" + std::to_string(in.mesh.pp);
  if (in.mesh.cp > 1) label += " cp=" + std::to_string(in.mesh.cp);
  if (in.mesh.ep > 1) label += " ep=" + std::to_string(in.mesh.ep);
  c.bars.push_back({label, r.per_rank, r.fits});
  return c;
}

// ---- the step as a picture (`--timeline FILE`) ---------------------------------------------------

namespace {
std::string event_label(const timeline_chart& c, const step_event& e) {
  switch (e.kind) {
    case step_event_kind::steady: return "step start";
    case step_event_kind::reduction: return "gradient reduction";
    case step_event_kind::optimizer_step: return "optimizer step";
    case step_event_kind::loss: return "loss";
    default: break;
  }
  if (e.entry >= c.model.size) return std::string(phase_name(e.in_phase));
  const layer_desc& l = c.model.entries[e.entry];
  const std::uint64_t n = instances_on_stage(l, c.events.stage, c.pipeline_stages);
  std::string name(l.name);
  if (n > 1) name += " x" + std::to_string(n);
  switch (e.kind) {
    case step_event_kind::teacher: return name + " (teacher)";
    case step_event_kind::backward_last: return name + ", last";
    case step_event_kind::backward_tail: return name + ", 2nd part";
    default: return name;
  }
}
const char* event_phase_text(const step_event& e) {
  if (e.kind == step_event_kind::reduction) return "gradient reduction";
  switch (e.in_phase) {
    case phase::steady: return "steady";
    case phase::forward: return "forward";
    case phase::backward: return "backward";
    case phase::optimizer_step: return "optimizer step";
  }
  return "";
}
}  // namespace

std::string render_timeline_svg(const timeline_chart& c) {
  const step_events& ev = c.events;
  if (ev.size == 0) throw usage_error("nothing to draw: the step has no moments");
  if (c.capacity.value == 0 || c.limit.value == 0) throw usage_error("cannot draw against a device without capacity");
  constexpr double gib = 1073741824.0;
  double highest = static_cast<double>(c.capacity.value) / gib;
  for (const step_event& e : ev) highest = std::max(highest, static_cast<double>(e.bytes_at.total().value) / gib);
  highest *= 1.06;  // room above the limit's line and the peak's mark, below the phase bands
  const double step = nice_step(highest);
  const double top = std::ceil(highest / step) * step;

  // Layout (px): plot left 80, top 96 (title, subtitle, peak text, phase band); one column per
  // moment, its entry's name written under it; legend to the right.
  const double n = static_cast<double>(ev.size);
  const double pitch = std::clamp(760.0 / n, 7.0, 44.0);
  const double left = 80, plot_top = 110, plot_h = 340, legend_w = 190;
  const double plot_w = pitch * n;
  const double label_h = 150;
  const double width = std::max(left + plot_w + legend_w, 720.0);
  const double height = plot_top + plot_h + label_h + 20;
  const auto y_of = [&](double g) { return plot_top + plot_h - g / top * plot_h; };
  const auto x_of = [&](std::size_t i) { return left + pitch * static_cast<double>(i); };
  const step_event& peak = ev.events[ev.peak];

  std::ostringstream s;
  s << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" << num(width) << "\" height=\""
    << num(height) << "\" viewBox=\"0 0 " << num(width) << " " << num(height)
    << "\" font-family=\"DejaVu Sans, Arial, sans-serif\" font-size=\"12\" data-events=\"" << ev.size
    << "\" data-peak-index=\"" << ev.peak << "\" data-peak-bytes=\"" << peak.bytes_at.total().value
    << "\" data-peak-phase=\"" << phase_name(peak.in_phase) << "\" data-limit=\"" << c.limit.value
    << "\" data-stage=\"" << ev.stage << "\">\n"
    << "<title>" << escape(c.title) << "</title>\n"
    << "<rect x=\"0\" y=\"0\" width=\"" << num(width) << "\" height=\"" << num(height) << "\" fill=\"#ffffff\"/>\n"
    << "<text x=\"" << num(left) << "\" y=\"24\" font-size=\"16\" font-weight=\"bold\">" << escape(c.title)
    << "</text>\n"
    << "<text x=\"" << num(left) << "\" y=\"44\" fill=\"#555555\">" << escape(c.subtitle) << "</text>\n";

  // Axis and grid.
  for (double g = 0; g <= top + step / 2; g += step) {
    const double y = y_of(g);
    s << "<line x1=\"" << num(left) << "\" y1=\"" << num(y) << "\" x2=\"" << num(left + plot_w) << "\" y2=\"" << num(y)
      << "\" stroke=\"#dddddd\"/>\n"
      << "<text x=\"" << num(left - 6) << "\" y=\"" << num(y + 4) << "\" text-anchor=\"end\">" << num(g) << "</text>\n";
  }
  s << "<text x=\"16\" y=\"" << num(plot_top + plot_h / 2) << "\" transform=\"rotate(-90 16 "
    << num(plot_top + plot_h / 2) << ")\" text-anchor=\"middle\">GiB on the rank</text>\n";

  // Phase bands above the plot, and a dotted line where a phase begins.
  const char* band_colors[] = {"#eeeeee", "#dbe8f5", "#f7e3d3", "#e3f0dc", "#eadcf0"};
  for (std::size_t i = 0; i < ev.size;) {
    std::size_t j = i;
    const std::string name = event_phase_text(ev.events[i]);
    while (j < ev.size && event_phase_text(ev.events[j]) == name) ++j;
    const std::size_t colour = ev.events[i].kind == step_event_kind::reduction
                                   ? 4
                                   : static_cast<std::size_t>(ev.events[i].in_phase);
    const double x0 = x_of(i), x1 = x_of(j);
    s << "<g class=\"phase\" data-phase=\"" << name << "\" data-first=\"" << i << "\" data-last=\"" << j - 1
      << "\">\n<rect x=\"" << num(x0) << "\" y=\"" << num(plot_top - 20) << "\" width=\"" << num(x1 - x0)
      << "\" height=\"16\" fill=\"" << band_colors[colour] << "\"/>\n";
    if (x1 - x0 >= 6.5 * static_cast<double>(name.size()))
      s << "<text x=\"" << num((x0 + x1) / 2) << "\" y=\"" << num(plot_top - 8) << "\" text-anchor=\"middle\" font-size=\"11\">"
        << name << "</text>\n";
    s << "</g>\n";
    if (i > 0)
      s << "<line x1=\"" << num(x0) << "\" y1=\"" << num(plot_top - 20) << "\" x2=\"" << num(x0) << "\" y2=\""
        << num(plot_top + plot_h) << "\" stroke=\"#999999\" stroke-dasharray=\"2 3\"/>\n";
    i = j;
  }

  // One stacked column per moment, bottom-up in category order, its bytes in data attributes.
  const std::size_t label_every = static_cast<std::size_t>(std::ceil(11.0 / pitch));
  for (std::size_t i = 0; i < ev.size; ++i) {
    const step_event& e = ev.events[i];
    const std::string label = event_label(c, e);
    const double x = x_of(i);
    s << "<g class=\"event\" data-index=\"" << i << "\" data-kind=\"" << step_event_kind_name(e.kind)
      << "\" data-phase=\"" << phase_name(e.in_phase) << "\" data-entry=\"" << escape(label) << "\" data-x0=\""
      << num(x) << "\" data-x1=\"" << num(x + pitch) << "\" data-total=\"" << e.bytes_at.total().value << "\"";
    for (std::size_t k = 0; k < category_count; ++k)
      s << " data-" << category_name(category(k)) << "=\"" << e.bytes_at[category(k)].value << "\"";
    s << ">\n<title>" << escape(label) << " (" << event_phase_text(e) << "): "
      << escape(to_string(e.bytes_at.total(), byte_unit::GiB)) << "</title>\n";
    double base = 0;
    for (std::size_t k = 0; k < category_count; ++k) {
      const double g = static_cast<double>(e.bytes_at[category(k)].value) / gib;
      if (g <= 0) continue;
      s << "<rect x=\"" << num(x) << "\" y=\"" << num(y_of(base + g)) << "\" width=\"" << num(pitch)
        << "\" height=\"" << num(y_of(base) - y_of(base + g)) << "\" fill=\"" << category_colors[k] << "\"/>\n";
      base += g;
    }
    s << "</g>\n";
    if (i % label_every == 0 || i == ev.peak) {
      const double lx = x + pitch / 2 + 4, ly = plot_top + plot_h + 8;
      s << "<text x=\"" << num(lx) << "\" y=\"" << num(ly) << "\" transform=\"rotate(-60 " << num(lx) << " " << num(ly)
        << ")\" text-anchor=\"end\" font-size=\"10\"" << (i == ev.peak ? " font-weight=\"bold\"" : "") << ">"
        << escape(label) << "</text>\n";
    }
  }
  s << "<line x1=\"" << num(left) << "\" y1=\"" << num(plot_top) << "\" x2=\"" << num(left) << "\" y2=\""
    << num(plot_top + plot_h) << "\" stroke=\"#333333\"/>\n"
    << "<line x1=\"" << num(left) << "\" y1=\"" << num(plot_top + plot_h) << "\" x2=\"" << num(left + plot_w)
    << "\" y2=\"" << num(plot_top + plot_h) << "\" stroke=\"#333333\"/>\n";

  // The device's limit (and capacity when a cap lowers it).
  const auto line = [&](bytes at, const char* color, const std::string& label) {
    const double y = y_of(static_cast<double>(at.value) / gib);
    s << "<line x1=\"" << num(left) << "\" y1=\"" << num(y) << "\" x2=\"" << num(left + plot_w) << "\" y2=\"" << num(y)
      << "\" stroke=\"" << color << "\" stroke-width=\"2\" stroke-dasharray=\"6 4\"/>\n"
      << "<text x=\"" << num(left + 4) << "\" y=\"" << num(y - 5) << "\" fill=\"" << color << "\">" << escape(label)
      << "</text>\n";
  };
  if (c.limit.value < c.capacity.value) line(c.capacity, "#777777", c.device + " capacity " + to_string(c.capacity, byte_unit::GiB));
  line(c.limit, "#b00020", c.device + (c.limit.value < c.capacity.value ? " limit " : " capacity ") +
                               to_string(c.limit, byte_unit::GiB));

  // The peak: a magenta triangle on top of its column, and what it is.
  const double px = x_of(ev.peak) + pitch / 2;
  const double py = y_of(static_cast<double>(peak.bytes_at.total().value) / gib);
  const double half = std::max(4.0, std::min(8.0, pitch / 2));
  s << "<g id=\"peak\" data-index=\"" << ev.peak << "\">\n<polygon points=\"" << num(px - half) << "," << num(py - 12)
    << " " << num(px + half) << "," << num(py - 12) << " " << num(px) << "," << num(py - 1)
    << "\" fill=\"#ff00ff\" stroke=\"#ff00ff\"/>\n"
    << "<text x=\"" << num(left) << "\" y=\"66\" font-weight=\"bold\">peak " << escape(to_string(peak.bytes_at.total(), byte_unit::GiB))
    << " in " << event_phase_text(peak) << ", at " << escape(event_label(c, peak))
    << (peak.bytes_at.total().value > c.limit.value ? " (does not fit)" : " (fits)") << "</text>\n</g>\n";

  // Legend.
  const double lx = left + plot_w + 20;
  for (std::size_t k = 0; k < category_count; ++k) {
    const double y = plot_top + 20 * static_cast<double>(category_count - 1 - k);
    s << "<rect x=\"" << num(lx) << "\" y=\"" << num(y) << "\" width=\"12\" height=\"12\" fill=\"" << category_colors[k]
      << "\"/>\n<text x=\"" << num(lx + 18) << "\" y=\"" << num(y + 10) << "\">" << category_name(category(k))
      << "</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

timeline_chart plan_timeline_chart(const plan_inputs& in, const plan_result& r) {
  timeline_chart c{};
  c.model = in.model;
  c.pipeline_stages = in.mesh.pp;
  c.events = plan_events(in.model, in.training, in.mesh, in.device, r);
  c.title = "memalg plan: ";
  if (!in.model.name.empty()) c.title += std::string(in.model.name) + ", ";
  c.title += parameter_count_text(r.parameters) + " parameters, one step";
  std::string mesh = "dp=" + std::to_string(in.mesh.dp) + " zero=" + std::to_string(in.mesh.zero_stage) +
                     " tp=" + std::to_string(in.mesh.tp) + " pp=" + std::to_string(in.mesh.pp);
  if (in.mesh.cp > 1) mesh += " cp=" + std::to_string(in.mesh.cp);
  if (in.mesh.ep > 1) mesh += " ep=" + std::to_string(in.mesh.ep);
  c.subtitle = mesh + ", micro-batch " + std::to_string(in.training.micro_batch) + ", stack " +
               std::string(stack_name(in.training.stack)) + " on " + std::string(in.device.name) + "; rank of stage " +
               std::to_string(r.most_loaded_stage);
  if (in.mesh.pp > 1)
    c.subtitle += " of " + std::to_string(in.mesh.pp) + ": its newest micro-batch over " +
                  std::to_string(c.events.tl.chunks_in_flight) + " in flight";
  c.device = std::string(in.device.name);
  c.capacity = in.device.capacity;
  c.limit = r.limit;
  return c;
}

void write_plan_timeline(const plan_flags& f, const std::string& path) {
  if (path.empty()) throw usage_error("--timeline needs a file name, not an empty one");
  const plan_inputs in = make_inputs(f);
  long long stage = -1;
  if (!f.stage.empty()) {  // (the same checks as run_plan, which then prints the same stage)
    if (f.stage.size() > 9 || f.stage.find_first_not_of("0123456789") != std::string::npos)
      throw usage_error("--stage must be a pipeline stage number (0 is the first), not '" + f.stage + "'");
    stage = std::stoll(f.stage);
    if (static_cast<std::uint64_t>(stage) >= in.mesh.pp)
      throw usage_error("--stage " + f.stage + " is not a pipeline stage (there are " + std::to_string(in.mesh.pp) + ")");
  }
  const plan_result r = evaluate_inputs(in, f, stage);
  require_sequence(in, f, &r);
  write_output_file(path, render_timeline_svg(plan_timeline_chart(in, r)), "--timeline");  // rendered whole first
}

void write_plan_svg(const plan_flags& f, const std::string& path) {
  const plan_inputs in = make_inputs(f);
  const plan_result r = evaluate_inputs(in, f);
  require_sequence(in, f, &r);
  write_svg(plan_chart(in, r), path);
}

}  // namespace memalg::cli
