// comfyfleet's extension of the graph editor: a menu entry that opens the fleet dashboard.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

app.registerExtension({
  name: "comfyfleet.fleet",
  commands: [
    {
      id: "comfyfleet.openFleet",
      label: "Fleet dashboard",
      icon: "pi pi-server",
      function: () => window.open(`${api.api_base}/fleet`, "_blank"),
    },
  ],
  menuCommands: [{ path: ["Fleet"], commands: ["comfyfleet.openFleet"] }],
});
