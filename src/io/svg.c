/*
 * svg.c — the SVG writer (svg.h): documents, shapes, and charts with a
 * frame, grid, curves and a legend, in the one style every figure uses.
 */
#include "svg.h"

void st_svg_begin(FILE *f, double w, double h, const char *font, int size) {
  fprintf(f,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
          "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"%s\"",
          w, h, w, h, font);
  if (size > 0) fprintf(f, " font-size=\"%d\"", size);
  fprintf(f, ">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
}

void st_svg_end(FILE *f) { fprintf(f, "</svg>\n"); }

int st_utf8_len(const char *s) {
  static const unsigned least[5] = {0, 0, 0x80, 0x800, 0x10000};
  unsigned c = (unsigned char)s[0], cp;
  int n = c < 0x80             ? 1
          : (c & 0xe0) == 0xc0 ? 2
          : (c & 0xf0) == 0xe0 ? 3
          : (c & 0xf8) == 0xf0 ? 4
                               : 0;
  if (n < 2) return n;
  cp = c & (0x7f >> n);
  for (int i = 1; i < n; i++) { /* a NUL ends it: not a continuation */
    if (((unsigned char)s[i] & 0xc0) != 0x80) return 0;
    cp = cp << 6 | ((unsigned char)s[i] & 0x3f);
  }
  if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return n;
}

void st_svg_escape(FILE *f, const char *s) {
  while (*s) {
    int n = st_utf8_len(s);
    unsigned char c = (unsigned char)*s;
    if (c == '<')
      fputs("&lt;", f);
    else if (c == '>')
      fputs("&gt;", f);
    else if (c == '&')
      fputs("&amp;", f);
    else if (c == '"')
      fputs("&quot;", f);
    else if (!n || (c < 0x20 && c != '\t' && c != '\n' && c != '\r'))
      fputs("\xef\xbf\xbd", f); /* U+FFFD */
    else
      fwrite(s, 1, (size_t)n, f);
    s += n ? n : 1;
  }
}

static void pen_attributes(FILE *f, st_svg_pen pen) {
  fprintf(f, " stroke=\"%s\"", pen.color);
  if (pen.width) fprintf(f, " stroke-width=\"%s\"", pen.width);
  if (pen.dash) fprintf(f, " stroke-dasharray=\"%s\"", pen.dash);
}

void st_svg_line(FILE *f, double x1, double y1, double x2, double y2,
                 st_svg_pen pen) {
  fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"", x1, y1,
          x2, y2);
  pen_attributes(f, pen);
  fprintf(f, "/>\n");
}

void st_svg_rect(FILE *f, double x, double y, double w, double h,
                 const char *fill, const char *stroke) {
  fprintf(f,
          "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
          "fill=\"%s\"",
          x, y, w, h, fill);
  if (stroke) fprintf(f, " stroke=\"%s\"", stroke);
  fprintf(f, "/>\n");
}

void st_svg_circle(FILE *f, double cx, double cy, double r, const char *fill) {
  fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%g\" fill=\"%s\"/>\n", cx, cy,
          r, fill);
}

void st_svg_poly_begin(FILE *f, st_svg_pen pen) {
  fprintf(f, "<polyline fill=\"none\"");
  pen_attributes(f, pen);
  fprintf(f, " points=\"");
}

void st_svg_poly_point(FILE *f, int first, double x, double y) {
  fprintf(f, "%s%.1f,%.1f", first ? "" : " ", x, y);
}

void st_svg_poly_end(FILE *f) { fprintf(f, "\"/>\n"); }

/* ---------------------------------------------------------------- charts */

double st_svg_x(const st_svg_chart *c, double x) {
  return c->L + (x - c->x0) / (c->x1 - c->x0) * (c->W - c->L - c->R);
}

double st_svg_y(const st_svg_chart *c, double y) {
  return c->H - c->B - (y - c->y0) / (c->y1 - c->y0) * (c->H - c->T - c->B);
}

void st_svg_chart_begin(st_svg_chart *c, const char *title, const char *xlabel,
                        const char *ylabel) {
  FILE *f = c->f;
  int mid_y = (c->T + c->H - c->B) / 2;
  st_svg_begin(f, c->W, c->H, "sans-serif", 13);
  fprintf(f, "<text x=\"%d\" y=\"28\" font-size=\"16\">", c->L);
  st_svg_escape(f, title);
  fprintf(f, "</text>\n");
  fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">",
          (c->L + c->W - c->R) / 2, c->H - 16);
  st_svg_escape(f, xlabel);
  fprintf(f,
          "</text>\n<text x=\"18\" y=\"%d\" text-anchor=\"middle\" "
          "transform=\"rotate(-90 18 %d)\">",
          mid_y, mid_y);
  st_svg_escape(f, ylabel);
  fprintf(f, "</text>\n");
  c->legend_rows = 0;
}

void st_svg_chart_end(st_svg_chart *c) {
  st_svg_rect(c->f, c->L, c->T, c->W - c->L - c->R, c->H - c->T - c->B, "none",
              "black");
  st_svg_end(c->f);
}

void st_svg_grid_x(const st_svg_chart *c, double x, const char *color,
                   const char *label) {
  double px = st_svg_x(c, x);
  st_svg_line(c->f, px, c->T, px, c->H - c->B, (st_svg_pen){color, 0, 0});
  if (!label) return;
  fprintf(c->f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">", px,
          c->H - c->B + 18);
  st_svg_escape(c->f, label);
  fprintf(c->f, "</text>\n");
}

void st_svg_grid_y(const st_svg_chart *c, double y, const char *color,
                   const char *label) {
  double py = st_svg_y(c, y);
  st_svg_line(c->f, c->L, py, c->W - c->R, py, (st_svg_pen){color, 0, 0});
  if (!label) return;
  fprintf(c->f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">", c->L - 6,
          py + 4);
  st_svg_escape(c->f, label);
  fprintf(c->f, "</text>\n");
}

void st_svg_mark_x(const st_svg_chart *c, double x, const char *fill,
                   const char *text) {
  fprintf(c->f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" fill=\"%s\">",
          st_svg_x(c, x), c->T + 16, fill);
  st_svg_escape(c->f, text);
  fprintf(c->f, "</text>\n");
}

void st_svg_legend(st_svg_chart *c, st_svg_pen pen, const char *fill,
                   const char *text_color, const char *text) {
  FILE *f = c->f;
  int x = c->W - c->R + 14, y = c->T + 10 + 22 * c->legend_rows++;
  if (pen.color)
    st_svg_line(f, x, y, x + 24, y, pen);
  else if (fill)
    st_svg_rect(f, x, y - 6, 24, 12, fill, "#999");
  fprintf(f, "<text x=\"%d\" y=\"%d\"", pen.color || fill ? x + 30 : x, y + 4);
  if (text_color) fprintf(f, " fill=\"%s\"", text_color);
  fprintf(f, ">");
  st_svg_escape(f, text);
  fprintf(f, "</text>\n");
}
