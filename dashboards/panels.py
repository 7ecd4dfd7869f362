"""What every Minder dashboard shares: the datasource variable, queries, panel and layout helpers.

Every panel and every query reads from the dashboard's ``datasource`` template variable (a
Prometheus datasource), so the same JSON works against any Prometheus that scrapes Minder.
"""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.builders import (
    bargauge,
    common,
    dashboard,
    heatmap,
    prometheus,
    stat,
    table,
    timeseries,
)
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as heatmap_m
from grafana_foundation_sdk.models import prometheus as prom_m

DATASOURCE_VARIABLE = "datasource"
"""Name of the datasource template variable every panel uses."""

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VARIABLE}}}")
"""The panels' datasource: whatever Prometheus the ``datasource`` variable selects."""

TAGS = ["minder"]
"""Tags of every Minder dashboard (the dashboards' link menu lists the dashboards by tag)."""

REFS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def new_dashboard(uid: str, title: str, description: str) -> dashboard.Dashboard:
    """A Minder dashboard: stable ``uid``, tags, datasource variable, links to its siblings."""
    return (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .time("now-6h", "now")
        .refresh("30s")
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .with_variable(
            dashboard.DatasourceVariable(DATASOURCE_VARIABLE)
            .label("Prometheus")
            .description("Prometheus that scrapes the Minder service and the node agents")
            .type("prometheus")
        )
        .link(
            dashboard.DashboardLink("Minder dashboards")
            .type(dm.DashboardLinkType.DASHBOARDS)
            .tags(TAGS)
            .as_dropdown(True)
            .include_vars(False)
            .keep_time(True)
        )
    )


def query_variable(name: str, label: str, query: str, description: str) -> dashboard.QueryVariable:
    """A single-valued variable filled from a Prometheus ``label_values(...)`` query."""
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .description(description)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.NATURAL_ASC)
        .include_all(False)
        .multi(False)
    )


def custom_variable(
    name: str, label: str, values: Sequence[str], description: str
) -> dashboard.CustomVariable:
    """A single-valued variable with a fixed list of values; the first one is the default."""
    options = [
        dm.VariableOption(selected=index == 0, text=value, value=value)
        for index, value in enumerate(values)
    ]
    return (
        dashboard.CustomVariable(name)
        .label(label)
        .description(description)
        .values(",".join(values))
        .options(options)
        .current(dm.VariableOption(selected=True, text=values[0], value=values[0]))
        .include_all(False)
        .multi(False)
    )


def textbox_variable(
    name: str, label: str, default: str, description: str
) -> dashboard.TextBoxVariable:
    """A free-text variable with a default value (e.g. a scrape job name)."""
    return (
        dashboard.TextBoxVariable(name)
        .label(label)
        .description(description)
        .default_value(default)
        .current(dm.VariableOption(selected=True, text=default, value=default))
    )


def query(
    expr: str, legend: str = "", *, ref: str = "A", instant: bool = False, as_table: bool = False
) -> prometheus.Dataquery:
    """A Prometheus query on the dashboard's datasource (a range query unless ``instant``)."""
    target = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
    target = target.instant() if instant else target.range()
    if legend:
        target = target.legend_format(legend)
    if as_table:
        target = target.format(prom_m.PromQueryFormat.TABLE)
    return target


def queries(*pairs: tuple[str, str]) -> list[prometheus.Dataquery]:
    """Range queries from ``(expr, legend)`` pairs, with refIds A, B, C …"""
    return [query(expr, legend, ref=REFS[i]) for i, (expr, legend) in enumerate(pairs)]


def thresholds(*steps: tuple[float | None, str]) -> dashboard.ThresholdsConfig:
    """Absolute thresholds; the first step's value is ``None`` (minus infinity)."""
    return (
        dashboard.ThresholdsConfig()
        .mode(dm.ThresholdsMode.ABSOLUTE)
        .steps([dm.Threshold(value=value, color=color) for value, color in steps])
    )


def _legend(calcs: Sequence[str]) -> common.VizLegendOptions:
    return (
        common.VizLegendOptions()
        .show_legend(True)
        .display_mode(common_m.LegendDisplayMode.TABLE)
        .placement(common_m.LegendPlacement.BOTTOM)
        .calcs(list(calcs))
    )


def _place(panel: cogbuilder.Builder[dm.Panel], span: int, height: int) -> None:
    """Set the size through the builder's ``span``/``height`` (all panel builders have them)."""
    getattr(panel, "span")(span)  # noqa: B009 - the builders share no typed base with these
    getattr(panel, "height")(height)  # noqa: B009


def timeseries_panel(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    *,
    unit: str,
    span: int = 12,
    height: int = 8,
    min_val: float | None = None,
    max_val: float | None = None,
    stacked: bool = False,
    fill_opacity: float = 10,
    legend_calcs: Sequence[str] = ("lastNotNull", "max"),
    threshold_steps: Sequence[tuple[float | None, str]] | None = None,
    decimals: float | None = None,
) -> timeseries.Panel:
    """A time series panel; ``threshold_steps`` draws dashed threshold lines."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(list(targets))
        .unit(unit)
        .line_width(1)
        .fill_opacity(fill_opacity)
        .show_points(common_m.VisibilityMode.NEVER)
        .span_nulls(False)
        .legend(_legend(legend_calcs))
        .tooltip(
            common.VizTooltipOptions()
            .mode(common_m.TooltipDisplayMode.MULTI)
            .sort(common_m.SortOrder.DESCENDING)
        )
    )
    _place(panel, span, height)
    if min_val is not None:
        panel = panel.min(min_val)
    if max_val is not None:
        panel = panel.max(max_val)
    if decimals is not None:
        panel = panel.decimals(decimals)
    if stacked:
        panel = panel.stacking(common.StackingConfig().mode(common_m.StackingMode.NORMAL))
    if threshold_steps:
        panel = panel.thresholds(thresholds(*threshold_steps)).thresholds_style(
            common.GraphThresholdsStyleConfig().mode(common_m.GraphThresholdsStyleMode.DASHED)
        )
    return panel


def stat_panel(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    *,
    unit: str,
    span: int = 4,
    height: int = 4,
    threshold_steps: Sequence[tuple[float | None, str]] = ((None, "green"),),
    mappings: list[dm.ValueMapping] | None = None,
    calc: str = "lastNotNull",
    graph: bool = True,
    decimals: float | None = None,
    text_mode: common_m.BigValueTextMode = common_m.BigValueTextMode.AUTO,
) -> stat.Panel:
    """A big-number panel of each series' last value, coloured by ``threshold_steps``."""
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(list(targets))
        .unit(unit)
        .thresholds(thresholds(*threshold_steps))
        .color_mode(common_m.BigValueColorMode.VALUE)
        .graph_mode(common_m.BigValueGraphMode.AREA if graph else common_m.BigValueGraphMode.NONE)
        .text_mode(text_mode)
        .reduce_options(common.ReduceDataOptions().calcs([calc]).values(False))
    )
    _place(panel, span, height)
    if mappings:
        panel = panel.mappings(mappings)
    if decimals is not None:
        panel = panel.decimals(decimals)
    return panel


def bargauge_panel(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    *,
    unit: str,
    span: int = 12,
    height: int = 8,
    calc: str = "lastNotNull",
    threshold_steps: Sequence[tuple[float | None, str]] = ((None, "green"),),
    min_val: float | None = None,
    max_val: float | None = None,
) -> bargauge.Panel:
    """Horizontal bars, one per series, of each series' ``calc`` over the time range."""
    panel = (
        bargauge.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(list(targets))
        .unit(unit)
        .thresholds(thresholds(*threshold_steps))
        .orientation(common_m.VizOrientation.HORIZONTAL)
        .display_mode(common_m.BarGaugeDisplayMode.GRADIENT)
        .reduce_options(common.ReduceDataOptions().calcs([calc]).values(False))
    )
    _place(panel, span, height)
    if min_val is not None:
        panel = panel.min(min_val)
    if max_val is not None:
        panel = panel.max(max_val)
    return panel


def table_panel(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    *,
    hide_columns: Sequence[str] = ("Time", "Value"),
    rename: dict[str, str] | None = None,
    unit: str = "none",
    span: int = 12,
    height: int = 8,
) -> table.Panel:
    """A table of an instant query's labels (``format: table``), without the listed columns."""
    panel = (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(list(targets))
        .unit(unit)
        .filterable(True)
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": dict.fromkeys(hide_columns, True),
                    "renameByName": dict(rename or {}),
                },
            )
        )
    )
    _place(panel, span, height)
    return panel


def heatmap_panel(
    title: str,
    description: str,
    target: prometheus.Dataquery,
    *,
    unit: str,
    span: int = 24,
    height: int = 10,
    color_max: float | None = None,
) -> heatmap.Panel:
    """A heatmap with one row per series (no bucketing: ``calculate`` off, ordinal y axis)."""
    color = (
        heatmap.HeatmapColorOptions()
        .mode(heatmap_m.HeatmapColorMode.SCHEME)
        .scheme("YlOrRd")
        .fill("dark-orange")
        .scale(heatmap_m.HeatmapColorScale.EXPONENTIAL)
        .exponent(0.5)
        .steps(64)
        .reverse(False)
        .min(0)
    )
    if color_max is not None:
        color = color.max(color_max)
    panel = (
        heatmap.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(target)
        .unit(unit)
        .calculate(False)
        .rows_frame(heatmap.RowsHeatmapOptions().layout(common_m.HeatmapCellLayout.UNKNOWN))
        .y_axis(heatmap.YAxisConfig().axis_placement(common_m.AxisPlacement.LEFT))
        .color(color)
        .cell_values(heatmap.CellValues().unit(unit).decimals(2))
        .cell_gap(1)
        .show_value(common_m.VisibilityMode.NEVER)
        .mode(common_m.TooltipDisplayMode.SINGLE)
        .show_y_histogram()
        .show_legend()
        .max_data_points(240)
    )
    _place(panel, span, height)
    return panel


def row(title: str) -> dashboard.Row:
    """An open (not collapsed) row that starts a new band of panels."""
    return dashboard.Row(title).collapsed(False)


def value_text(mapping: dict[str, tuple[str, str]]) -> dm.ValueMap:
    """A value mapping: ``{"1": ("up", "green")}`` shows 1 as a green ``up``."""
    return dm.ValueMap(
        options={
            value: dm.ValueMappingResult(text=text, color=color, index=i)
            for i, (value, (text, color)) in enumerate(mapping.items())
        }
    )


def fill_between(lower: str) -> list[dm.DynamicConfigValue]:
    """Override properties for a band's upper series: no line, shaded down to series ``lower``."""
    return [
        dm.DynamicConfigValue(id_val="custom.fillBelowTo", value=lower),
        dm.DynamicConfigValue(id_val="custom.fillOpacity", value=20),
        dm.DynamicConfigValue(id_val="custom.lineWidth", value=0),
        dm.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": "blue"}),
    ]


def series_style(color: str, width: float, *, dashed: bool = False) -> list[dm.DynamicConfigValue]:
    """Override properties giving a series a fixed colour and line width (optionally dashed)."""
    props = [
        dm.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": color}),
        dm.DynamicConfigValue(id_val="custom.lineWidth", value=width),
        dm.DynamicConfigValue(id_val="custom.fillOpacity", value=0),
    ]
    if dashed:
        props.append(
            dm.DynamicConfigValue(
                id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}
            )
        )
    return props


def data_link(title: str, url: str) -> dashboard.DashboardLink:
    """A link on a panel's data points (``url`` may use ``${__field.labels.x}`` and variables)."""
    return dashboard.DashboardLink(title).url(url).target_blank(False)


class _PrometheusAnnotationModel(dm.AnnotationQuery):
    """An annotation query of the Prometheus datasource.

    The SDK's ``AnnotationQuery`` model knows only the fields every datasource shares; the
    Prometheus datasource also reads ``step``, ``titleFormat``, ``tagKeys``, ``textFormat`` and
    ``useValueForTime``, added here to its JSON.
    """

    def __init__(self, *, step: str, title_format: str, tag_keys: str, text_format: str) -> None:
        super().__init__()
        self.step = step
        self.title_format = title_format
        self.tag_keys = tag_keys
        self.text_format = text_format

    def to_json(self) -> dict[str, object]:
        payload = super().to_json()
        payload.update(
            {
                "step": self.step,
                "titleFormat": self.title_format,
                "tagKeys": self.tag_keys,
                "textFormat": self.text_format,
                "useValueForTime": False,
            }
        )
        return payload


class PrometheusAnnotation(cogbuilder.Builder[dm.AnnotationQuery]):
    """Builds a Prometheus annotation: one region per stretch of time where ``expr`` has data."""

    def __init__(
        self,
        name: str,
        expr: str,
        *,
        title_format: str,
        tag_keys: str = "",
        text_format: str = "",
        step: str = "1m",
        color: str = "red",
    ) -> None:
        self._internal = _PrometheusAnnotationModel(
            step=step, title_format=title_format, tag_keys=tag_keys, text_format=text_format
        )
        self._internal.name = name
        self._internal.datasource = DATASOURCE
        self._internal.enable = True
        self._internal.hide = False
        self._internal.icon_color = color
        self._internal.expr = expr

    def build(self) -> dm.AnnotationQuery:
        """The annotation query model."""
        return self._internal
