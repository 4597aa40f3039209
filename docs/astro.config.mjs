// The harness documentation site. Pages live in src/content/docs/; the reference pages under
// reference/ are generated from the code by `python scripts/docs.py` (a test fails when they
// are stale). Search is Starlight's built-in Pagefind index, made at build time: no service.
import { defineConfig, passthroughImageService } from "astro/config";
import starlight from "@astrojs/starlight";

export default defineConfig({
  // No image optimisation: the site has no raster images of its own, and sharp's native
  // build is one more thing a fresh machine would have to compile.
  image: { service: passthroughImageService() },
  integrations: [
    starlight({
      title: "harness",
      description:
        "Declarative, content-addressed environments and a thin runtime for robot-agent model services.",
      sidebar: [
        { label: "Guides", autogenerate: { directory: "guides" } },
        { label: "Reference", autogenerate: { directory: "reference" } },
      ],
    }),
  ],
});
